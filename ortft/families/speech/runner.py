"""Running a Whisper export (``ortft.families.speech.graphs``): ``OnnxWhisper`` over
encoder_model.onnx, decoder_model_merged.onnx and features.onnx, generating as transformers' Whisper ``generate`` does.

What ``WhisperForConditionalGeneration.generate(input_features)`` does for short-form audio
(transformers 5.24, ``models/whisper/generation_whisper.py``), and the port here:

- **init tokens** (``_retrieve_init_tokens``): ``decoder_start_token_id``, the language token
  (``language`` through ``lang_to_id``; with ``language`` None and a ``lang_to_id``, the language
  *detected*: one decoder step from the start token, argmax over the language tokens), the
  task token (``task_to_id``; "transcribe" by default when a language is set), then
  ``no_timestamps_token_id``. The legacy ``forced_decoder_ids`` when neither is set.
- **processors** (``_retrieve_logit_processors``): the generation config's own with its
  ``suppress_tokens`` and ``begin_suppress_tokens`` cleared, then ``SuppressTokensAtBegin``
  (``begin_index`` = the number of init tokens) and ``SuppressTokens``, appended after them as
  ``generate`` merges custom processors. Greedy or the config's ``num_beams``: Whisper decodes
  without sampling whatever ``do_sample`` says (its ``temperature`` argument is None).
- **lengths** (``_set_max_new_tokens_and_length``): ``max_new_tokens``, else ``max_length`` (20
  by default) *plus* the init tokens, within ``max_target_positions``; more is an error.
- **what it returns**: the new tokens only (no init tokens), each row's padding and final eos
  taken off, the rows padded right with ``pad_token_id`` to the longest.

Not reproduced, and refused (``refuse``): timestamps (``return_timestamps``: the timestamp
processor and long-form seeking), ``no_speech_threshold``, and the generation options
``ortft.export.generation`` does not apply. A short clip whose tokens hold two timestamp tokens
in a row makes ``generate`` seek and decode again from there; the runner raises instead.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np

from ortft.core.errors import InputError, RunError
from ortft.export import cross_cache, generation, parity

ENCODER, DECODER = cross_cache.ENCODER, cross_cache.DECODER
FEATURES = "features.onnx"
DEFAULT_MAX_LENGTH = 20  # GenerationConfig's global default, which Whisper counts as new tokens
TASK_IDS = ("translate", "transcribe")  # transformers' whisper TASK_IDS


def refuse(gc: Any) -> None:
    """An InputError naming the first generation setting the runner does not reproduce."""
    if getattr(gc, "return_timestamps", None):
        raise InputError(
            "generation_config.return_timestamps=True: the ONNX export decodes without "
            "timestamps (no timestamp processor, no long-form seeking); set it to false"
        )
    if getattr(gc, "no_speech_threshold", None) is not None:
        raise InputError(
            "generation_config.no_speech_threshold: no-speech skipping is not reproduced by the "
            "ONNX export; set it to null"
        )
    bad = generation.unsupported(gc)
    if bad:
        raise InputError(f"generation_config.{bad[0]}={getattr(gc, bad[0])!r}: not reproduced")
    task = getattr(gc, "task", None)
    if task is not None and task not in TASK_IDS:
        raise InputError(f"generation_config.task={task!r}: choose one of {', '.join(TASK_IDS)}")


def _language_id(gc: Any, language: str) -> int:
    from transformers.models.whisper.tokenization_whisper import TO_LANGUAGE_CODE

    language = language.lower()
    if language in gc.lang_to_id:
        token = language
    elif language in TO_LANGUAGE_CODE:
        token = f"<|{TO_LANGUAGE_CODE[language]}|>"
    elif language in TO_LANGUAGE_CODE.values():
        token = f"<|{language}|>"
    else:
        raise InputError(f"generation_config.language={language!r}: not a Whisper language")
    if token not in gc.lang_to_id:
        raise InputError(f"generation_config.language={language!r}: {token} not in lang_to_id")
    return int(gc.lang_to_id[token])


def _forced(gc: Any, config: Any) -> list[int | None]:
    """The init tokens of a legacy ``forced_decoder_ids`` (task and language both unset)."""
    forced = getattr(gc, "forced_decoder_ids", None)
    if forced is None:
        forced = getattr(config, "forced_decoder_ids", None)
    tokens: list[int | None] = []
    if forced and forced[0][0] == 1:
        while forced and forced[0][0] == len(tokens) + 1:
            tokens.append(forced[0][1])
            forced = forced[1:]
        if forced:
            raise InputError(f"generation_config.forced_decoder_ids: {forced} skip a position")
    return tokens


def init_tokens(gc: Any, config: Any, batch: int, detect: Any) -> np.ndarray:
    """``_retrieve_init_tokens`` for ``batch`` rows: [batch, k] int64. ``detect()`` gives the
    detected language id of each row; it is called only when generate would detect."""
    task, language = getattr(gc, "task", None), getattr(gc, "language", None)
    head: list[int | None] = [gc.decoder_start_token_id]
    if task is None and language is None:
        head += _forced(gc, config)
    undefined = len(head) <= 1 or head[1] is None
    languages = list(language) if isinstance(language, list | tuple) else [language]
    if isinstance(language, list | tuple) and (len(languages) != batch or None in languages):
        raise InputError(f"generation_config.language: {language!r} is not one per row ({batch})")
    lang_ids: list[int] | None = None
    if language is not None:
        lang_ids = [_language_id(gc, str(lang)) for lang in languages]
    elif hasattr(gc, "lang_to_id") and undefined:
        lang_ids = [int(i) for i in detect()]
        languages = [None] * batch
    rows = []
    for i in range(len(languages)):
        row = list(head)
        if lang_ids is not None:
            if len(row) > 1:
                row[1] = lang_ids[i]
            else:
                row.append(lang_ids[i])
        task_ids = list(getattr(gc, "task_to_id", {}).values())
        if task is not None:
            row.append(gc.task_to_id[task])
        elif language is not None and task_ids and not any(t in row for t in task_ids):
            row.append(gc.task_to_id["transcribe"])  # a language and no task: transcribe
        no_ts = getattr(gc, "no_timestamps_token_id", None)
        if no_ts is not None and row[-1] != no_ts:
            row.append(no_ts)
        rows.append([int(t) for t in row if t is not None])
    out = np.asarray(rows, dtype=np.int64)
    return out if len(out) == batch else np.repeat(out, batch, axis=0)  # one language: each row


def lengths(gc: Any, config: Any, init_len: int) -> Any:
    """A copy of ``gc`` with Whisper's lengths (``_set_max_new_tokens_and_length``)."""
    gc = copy.deepcopy(gc)
    limit = int(config.max_target_positions)
    if gc.max_new_tokens is not None and gc.max_new_tokens + init_len > limit:
        raise InputError(
            f"max_new_tokens {gc.max_new_tokens} + {init_len} init tokens exceeds the model's "
            f"max_target_positions {limit}"
        )
    if gc.max_new_tokens is None:
        base = gc.max_length if gc.max_length is not None else DEFAULT_MAX_LENGTH
        gc.max_length = min(base + min(limit // 2 - 1, init_len), limit)
    return gc


def plan(gc: Any, config: Any, init_len: int) -> generation.Plan:
    """The search plan of ``generate``: the config's processors without its suppress fields,
    then Whisper's two suppressors (``_retrieve_logit_processors`` order, appended last)."""
    from transformers.generation import logits_process as lp

    gc = lengths(gc, config, init_len)
    bare = copy.deepcopy(gc)
    bare.suppress_tokens = bare.begin_suppress_tokens = None
    positions = getattr(config, "max_position_embeddings", None)
    p = generation.plan(bare, init_len, encoder_decoder=True, max_positions=positions)
    if gc.begin_suppress_tokens is not None:
        p.processors.append(
            lp.SuppressTokensAtBeginLogitsProcessor(gc.begin_suppress_tokens, init_len)
        )
    if gc.suppress_tokens is not None:
        p.processors.append(lp.SuppressTokensLogitsProcessor(gc.suppress_tokens))
    return p


def new_tokens(sequences: np.ndarray, init_len: int, gc: Any) -> list[np.ndarray]:
    """Each row's tokens as ``generate_with_fallback`` keeps them: the init tokens dropped, its
    padding (as many tokens as it holds pad ids, one fewer when pad is eos), then a final eos."""
    pad, eos = gc.pad_token_id, gc.eos_token_id
    eos = int(np.atleast_1d(eos)[0]) if eos is not None else None
    rows = []
    for row in sequences[:, init_len:]:
        if pad is not None and len(row) and row[-1] == pad:
            n = int(np.sum(row == pad)) - (1 if pad == eos else 0)
            row = row[: len(row) - n] if n else row
        if eos is not None and len(row) and row[-1] == eos:
            row = row[:-1]
        rows.append(row)
    return rows


def padded(rows: list[np.ndarray], pad: int) -> np.ndarray:
    """``_pad_to_max_length``: the rows padded right to the longest."""
    width = max((len(r) for r in rows), default=0)
    out = np.full((len(rows), width), pad, dtype=np.int64)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return out


def _check_segments(rows: list[np.ndarray], gc: Any) -> None:
    """Two timestamp tokens in a row end a segment (``_retrieve_segment``): unless the row
    ends on a single timestamp, ``generate`` drops what follows the last pair, seeks there and
    decodes the rest of the clip again (its long-form loop), which this runner does not do."""
    no_ts = getattr(gc, "no_timestamps_token_id", None)
    if no_ts is None:
        return
    for i, row in enumerate(rows):
        stamp = row > no_ts  # timestamp tokens follow <|notimestamps|>
        single_end = len(row) >= 2 and not stamp[-2] and stamp[-1]
        if np.any(stamp[:-1] & stamp[1:]) and not single_end:
            raise RunError(
                f"row {i}: the model generated two timestamp tokens in a row; transformers "
                "would decode the clip again from there, which the ONNX runner does not"
            )


class OnnxWhisper:
    """The sessions of a speech export, run as ``ortft eval`` / ``predict`` need them."""

    def __init__(self, folder: Path, config: Any, threads: int = 0):
        self.folder = Path(folder)
        cross_cache.refuse_old(self.folder)
        self.encoder = parity.session(self.folder / ENCODER, threads)
        self.decoder = parity.session(self.folder / DECODER, threads)
        self.features_path = self.folder / FEATURES
        self.threads = threads
        self.config = config
        self.generation_config = generation.load(self.folder, config)
        self._extractor: Any = None  # the saved feature extractor, for an export without features

    def _decode(self, tokens, hidden, past: cross_cache.Past) -> np.ndarray:
        """One step's logits; ``past`` takes the step's caches."""
        feeds = {"input_ids": tokens, "encoder_hidden_states": hidden, **past.feeds()}
        out = self.decoder.run(None, feeds)
        past.update(out)
        return out[0]

    def encode(self, input_features: np.ndarray) -> np.ndarray:
        feats = np.ascontiguousarray(input_features, dtype=np.float32)
        return self.encoder.run(None, {"input_features": feats})[0]

    def logits(self, input_features: np.ndarray, labels: np.ndarray) -> np.ndarray:
        """Teacher-forced logits: the decoder fed the labels shifted right as the model's own
        forward shifts them (-100 -> pad, ``decoder_start_token_id`` first)."""
        from ortft.export.decoder import shift_right

        c = self.config
        dec = shift_right(labels, int(c.pad_token_id), int(c.decoder_start_token_id), "whisper")
        hidden = self.encode(input_features)
        return self._decode(dec, hidden, cross_cache.Past(self.decoder, len(dec)))

    def detect_language(self, hidden: np.ndarray, gc: Any) -> np.ndarray:
        """``detect_language``: one step from the start token, argmax over the language ids
        (in id order, so a tie goes to the lowest id as torch's argmax gives it)."""
        start = np.full((len(hidden), 1), int(gc.decoder_start_token_id), dtype=np.int64)
        logits = self._decode(start, hidden, cross_cache.Past(self.decoder, len(hidden)))
        ids = np.array(sorted(int(i) for i in gc.lang_to_id.values()))
        return ids[np.argmax(logits[:, -1][:, ids], axis=-1)]

    def config_for(self, max_new_tokens: int | None, num_beams: int | None = None) -> Any:
        """The export's generation config with ``generate``'s overrides (None: the config's)."""
        fields: dict[str, Any] = {}
        if max_new_tokens is not None:
            fields["max_new_tokens"] = max_new_tokens
        if num_beams is not None:
            fields["num_beams"] = num_beams
        return generation.deterministic(self.generation_config, **fields)

    def search(self, input_features: np.ndarray, gc: Any):
        """(sequences with the init tokens, each step's raw logits, the number of init tokens)
        with the generation config ``gc`` as it is."""
        refuse(gc)
        frames = 2 * int(self.config.max_source_positions)  # conv2's stride 2
        if input_features.shape[-1] != frames:
            raise InputError(f"input_features: {input_features.shape[-1]} frames, not {frames}")
        hidden = self.encode(input_features)
        init = init_tokens(gc, self.config, len(hidden), lambda: self.detect_language(hidden, gc))
        p = plan(gc, self.config, init.shape[1])
        seq, raw = generation.generate(
            cross_cache.Steps(self.decoder, self._decode, hidden), init, p
        )
        return seq, raw, init.shape[1]

    def rows(self, input_features: np.ndarray, gc: Any) -> list[np.ndarray]:
        """Each clip's tokens as ``generate`` returns them, before the rows are padded."""
        seq, _, k = self.search(input_features, gc)
        if getattr(gc, "force_unique_generate_call", None):  # generate's whole output
            return list(seq)
        out = new_tokens(seq, k, gc)
        _check_segments(out, gc)
        return out

    def generate(
        self,
        input_features: np.ndarray,
        max_new_tokens: int | None = None,
        num_beams: int | None = None,
    ) -> np.ndarray:
        """Token ids as ``model.generate(input_features, max_new_tokens=...)`` returns them for
        short-form audio (the new tokens, rows padded with pad_token_id)."""
        gc = self.config_for(max_new_tokens, num_beams)
        pad = gc.pad_token_id if gc.pad_token_id is not None else 0
        return padded(self.rows(input_features, gc), int(pad))

    def features(self, samples: np.ndarray) -> np.ndarray:
        """One clip (float32 [n], mono, 16 kHz) -> input_features [1, mel, frames]: features.onnx,
        else (an export without it) the saved feature extractor."""
        if self.features_path.exists():
            from ortft.families.speech import features as audio_features

            return audio_features.run(self.features_path, samples, self.threads)
        if self._extractor is None:
            from transformers import WhisperFeatureExtractor

            self._extractor = WhisperFeatureExtractor.from_pretrained(self.folder)
        fe = self._extractor
        return fe(samples, sampling_rate=fe.sampling_rate, return_tensors="np").input_features

    def transcribe(
        self, clips: list[np.ndarray], max_new_tokens: int | None = None, batch_size: int = 8
    ) -> list[np.ndarray]:
        """Each raw clip's tokens (unpadded): features one clip at a time, then the encoder and
        decoder ``batch_size`` clips at a time. Decode with the tokenizer."""
        gc = self.config_for(max_new_tokens)
        out: list[np.ndarray] = []
        for start in range(0, len(clips), batch_size):
            feats = np.concatenate([self.features(c) for c in clips[start : start + batch_size]])
            out.extend(self.rows(feats, gc))
        return out
