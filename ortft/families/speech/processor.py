"""Speech processors: what an audio task loads where a text task loads its tokenizer.

A Whisper run needs two things: the feature extractor (16 kHz samples -> log-mel frames) and
the tokenizer of its transcripts. transformers keeps them together as a ``WhisperProcessor``,
saved in one folder (``preprocessor_config.json`` + the tokenizer files) and loaded by
``AutoProcessor`` and by ``pipeline("automatic-speech-recognition")``; ortft saves it as the
run's ``processor/`` and in ``final/``.

A model built ``from_config`` gets:
- a feature extractor sized to the config: ``num_mel_bins`` mel bins, and a window of
  ``max_source_positions`` encoder positions (the conv front-end halves 100 frames a second:
  50 positions a second, so 1500 -> Whisper's 30 s, 100 -> 2 s);
- a byte-level BPE tokenizer trained on the transcripts (``model.tokenizer.train``) or loaded
  (``model.tokenizer.path``), with Whisper's special tokens in Whisper's order: end-of-text,
  start-of-transcript, one token per language (``WhisperTokenizer`` finds a language's token
  as start-of-transcript + 1 + its index), translate, transcribe, start-of-lm, start-of-prev,
  no-captions, no-timestamps. No timestamp tokens: ortft trains and decodes without them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ortft.core.errors import InputError, first_line
from ortft.recipe.io import LoadedRecipe
from ortft.recipe.model import TrainTokenizer

EOT, SOT, NO_TIMESTAMPS = "<|endoftext|>", "<|startoftranscript|>", "<|notimestamps|>"
TASK_TOKENS = ("<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>")
# where a saved processor keeps its feature extractor: transformers 5 writes processor_config.json
# (the feature extractor inside it), a Hub checkpoint has preprocessor_config.json
FILES = ("processor_config.json", "preprocessor_config.json")
POSITIONS_PER_SECOND = 50  # 16 kHz / hop 160 = 100 frames a second, halved by the stride-2 conv


def special_tokens() -> list[str]:
    """Whisper's special tokens after end-of-text, in its order (see the module docstring)."""
    from transformers.models.whisper.tokenization_whisper import LANGUAGES

    return [
        SOT,
        *(f"<|{code}|>" for code in LANGUAGES),
        *TASK_TOKENS,
        "<|nocaptions|>",
        NO_TIMESTAMPS,
    ]


def is_whisper(tokenizer: Any) -> bool:
    """Whether ``tokenizer`` has Whisper's start-of-transcript token (a real Whisper one)."""
    return SOT in tokenizer.get_vocab()


def train_tokenizer(texts: list[str], spec: TrainTokenizer, language: str | None) -> Any:
    """A ``WhisperTokenizer`` (byte-level BPE) trained on ``texts``, Whisper's special tokens
    added, its prefix set to transcribe in ``language``."""
    from transformers import WhisperTokenizer

    from ortft.backends.torch import models

    if spec.kind != "byte-bpe":
        raise InputError(
            f"model.tokenizer.train.kind={spec.kind}: Whisper's tokenizer is byte-level BPE; "
            "set kind: byte-bpe"
        )
    tok = models.train_byte_bpe(texts, spec)  # its one special token: end-of-text (EOT)
    model = json.loads(tok.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    whisper = WhisperTokenizer(vocab=model["vocab"], merges=merges, pad_token=EOT)
    whisper.add_special_tokens({"additional_special_tokens": special_tokens()})
    whisper.set_prefix_tokens(language=language, task="transcribe", predict_timestamps=False)
    return whisper


def feature_extractor_for(config: Any) -> Any:
    """A ``WhisperFeatureExtractor`` whose window fills ``config``'s encoder positions."""
    from transformers import WhisperFeatureExtractor

    positions = getattr(config, "max_source_positions", None)
    mels = getattr(config, "num_mel_bins", None)
    if not positions or not mels:
        raise InputError(
            f"model.from_config: {type(config).__name__} has no max_source_positions / "
            "num_mel_bins (speech-recognition builds Whisper models)"
        )
    seconds = positions / POSITIONS_PER_SECOND
    if seconds != int(seconds):
        raise InputError(
            f"model.from_config.options.max_source_positions={positions}: must be a multiple "
            f"of {POSITIONS_PER_SECOND} (50 encoder positions a second of audio)"
        )
    return WhisperFeatureExtractor(feature_size=mels, chunk_length=int(seconds))


def load(loaded: LoadedRecipe, source: str | None, saved_dir: Path | None) -> Any:
    """The ``WhisperProcessor`` of ``saved_dir`` (a resumed run) or of the model folder
    ``source``; None where the model is built from a config (``for_config`` then)."""
    folder = str(saved_dir) if saved_dir else source
    if folder is None:
        return None
    field = str(saved_dir) if saved_dir else "model.name_or_path"
    if Path(folder).is_dir() and not any((Path(folder) / f).exists() for f in FILES):
        raise InputError(
            f"{field}: {folder} has no {' or '.join(FILES)} (a speech model needs "
            "its feature extractor)"
        )
    return from_folder(folder, field, loaded.recipe.model.trust_remote_code)


def from_folder(folder: str, field: str = "model", trust_remote_code: bool = False) -> Any:
    """``AutoProcessor`` of ``folder``: a feature extractor and a real Whisper tokenizer
    (transformers 5 builds a 5-token tokenizer from a folder without tokenizer files)."""
    from transformers import AutoProcessor

    try:
        processor = AutoProcessor.from_pretrained(folder, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError, TypeError) as err:
        first = first_line(err)
        raise InputError(f"{field}: {folder}: cannot load the speech processor ({first})") from None
    tok = getattr(processor, "tokenizer", None)
    if getattr(processor, "feature_extractor", None) is None or tok is None:
        raise InputError(f"{field}: {folder}: not a speech processor ({type(processor).__name__})")
    if not is_whisper(tok):
        raise InputError(
            f"{field}: {folder}: its tokenizer ({len(tok)} tokens) has no {SOT}; it is not a "
            "Whisper tokenizer (are the tokenizer files there?)"
        )
    return processor


def for_config(config: Any, tokenizer: Any) -> Any:
    """The processor of a from_config model: its feature extractor and ``tokenizer``."""
    from transformers import WhisperProcessor

    if not is_whisper(tokenizer):
        raise InputError(
            f"model.tokenizer: a {len(tokenizer)}-token tokenizer without {SOT}: a Whisper "
            "model needs Whisper's special tokens (use model.tokenizer.train)"
        )
    return WhisperProcessor(feature_extractor=feature_extractor_for(config), tokenizer=tokenizer)
