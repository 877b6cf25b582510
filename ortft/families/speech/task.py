"""speech-recognition: audio clips to their transcripts (Whisper); loss, WER and CER.

Rows name audio files (``data.audio_column``: WAV, FLAC or OGG, decoded with soundfile) and
hold their transcripts (``data.text_column``). ``encode`` checks every file once
(``ortft.families.speech.audio``) and keeps its path, what converting it will take (stereo, another
sample rate, a clip over ``task.max_seconds``) and the transcript's tokens; ``collate`` decodes
a batch's clips to mono at the feature extractor's rate, cuts them, and runs the feature
extractor (log-mel frames: ``input_features``, computed per batch, never cached).

Labels are the tokenizer's ids without the leading start-of-transcript: Whisper's forward
builds its decoder inputs by shifting the labels right behind ``decoder_start_token_id``, so
the model learns the language, transcribe and no-timestamps tokens, then the text, then
end-of-text. ``decoder_attention_mask`` (ones over the shifted real labels) is always passed:
transformers 5.24 calls ``torch.diff`` (no ONNX symbolic in torch 2.6) for a decoder that gets
no mask and no cache, which ORTModule cannot export.

Eval: the loss, then greedy ``generate`` (the model's generation config: its language and task
tokens, suppressed tokens) on the first ``task.generate_samples`` rows; ``wer`` and ``cer`` by
jiwer, after the normalisation ``normalize`` states (``task.normalize``). A CTC model
(wav2vec2) fits the same shape: ``feature_key`` is the processor's first model input
(``input_values``), and only ``forward`` and ``transcribe`` change.
"""

from __future__ import annotations

import logging
import re
import unicodedata
from collections import Counter
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field

from ortft.core.constants import IGNORE_INDEX
from ortft.core.errors import InputError
from ortft.families.speech import audio
from ortft.families.speech.starter import STARTER
from ortft.tasks.base import Encoded, Task, TaskOptions, skip_bad_file

log = logging.getLogger("ortft")

PATH = "_audio"  # the encoded column of file paths (bytes); "_": never fed to the model
LENGTH = "_length"  # real label tokens per row (batches cut labels to the longest)
# what converting each clip takes, counted in summary.json's data.audio
STEREO, RATE, CUT, TEXT_CUT = "_stereo", "_rate", "_cut", "_text_cut"
WHISPER_POSITIONS = 448  # Whisper's decoder positions (max_target_positions), labels' default


class Options(TaskOptions):
    name: Literal["speech-recognition"] = "speech-recognition"
    language: str | None = Field(
        "en",
        description="speech-recognition: the language token the decoder is started with (a "
        "Whisper language code: en, de, fr...); null: none (an English-only Whisper).",
    )
    max_target_length: Annotated[int, Field(ge=4, le=4096)] = Field(
        WHISPER_POSITIONS,
        description="speech-recognition: label tokens per clip at most (the 3 prompt tokens, "
        "the transcript, end-of-text); longer transcripts are truncated and counted. At most "
        "the decoder's positions (config max_target_positions: 448 for Whisper).",
    )
    max_seconds: Annotated[float, Field(gt=0)] | None = Field(
        None,
        description="speech-recognition: clips are cut at this many seconds (counted); "
        "default: the feature extractor's window (Whisper: 30 s).",
    )
    generate_samples: Annotated[int, Field(ge=0)] = Field(
        256,
        description="speech-recognition: eval clips transcribed with generate() for WER/CER "
        "(0: none).",
    )
    normalize: bool = Field(
        True,
        description="speech-recognition: WER/CER on lowercased text without punctuation, "
        "whitespace collapsed (both sides); false: on the text as it is.",
    )


def normalize(text: str) -> str:
    """The text WER and CER compare: NFKC, lowercase, every punctuation or symbol character
    (Unicode categories P* and S*) replaced by a space, whitespace collapsed. Apostrophes go too
    ("don't" -> "don t", on both sides alike)."""
    text = unicodedata.normalize("NFKC", text).lower()
    text = "".join(" " if unicodedata.category(c)[0] in "PS" else c for c in text)
    return re.sub(r"\s+", " ", text).strip()


def error_rates(predictions: list[str], references: list[str], norm: bool) -> dict[str, float]:
    """jiwer's corpus WER and CER (errors over reference words / characters)."""
    import jiwer

    hyp = [normalize(p) if norm else p.strip() for p in predictions]
    ref = [normalize(r) if norm else r.strip() for r in references]
    keep = [i for i, r in enumerate(ref) if r]  # jiwer refuses an empty reference
    if not keep:
        return {}
    hyp, ref = [hyp[i] for i in keep], [ref[i] for i in keep]
    return {"wer": float(jiwer.wer(ref, hyp)), "cer": float(jiwer.cer(ref, hyp))}


def generation_config(tokenizer: Any, config: Any, language: str | None) -> Any:
    """Whisper's generation fields for a model built from scratch: decode from
    start-of-transcript, language and transcribe tokens, no timestamps; end-of-text is not
    allowed first (an empty transcript), as Whisper's own ``begin_suppress_tokens``."""
    from transformers import GenerationConfig
    from transformers.models.whisper.tokenization_whisper import LANGUAGES

    ids = tokenizer.convert_tokens_to_ids
    return GenerationConfig(
        decoder_start_token_id=ids("<|startoftranscript|>"),
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.eos_token_id,
        max_length=int(config.max_target_positions),
        lang_to_id={f"<|{c}|>": ids(f"<|{c}|>") for c in LANGUAGES},
        task_to_id={"transcribe": ids("<|transcribe|>"), "translate": ids("<|translate|>")},
        no_timestamps_token_id=ids("<|notimestamps|>"),
        is_multilingual=True,
        language=language,
        task="transcribe",
        return_timestamps=False,
        suppress_tokens=[],
        begin_suppress_tokens=[tokenizer.eos_token_id],
    )


class SpeechRecognition(Task):
    name = "speech-recognition"
    modality = "audio"
    auto_class = "AutoModelForSpeechSeq2Seq"
    row_local = True  # each file checked on its own
    is_decoder = True
    export_kind = "speech"
    starter = STARTER  # ortft init --task
    # cut to the batch's longest transcript (collate may run before the cut)
    aligned_keys = ("labels", "decoder_attention_mask")
    predicts = "transcript"
    eval_metrics = ("eval_loss", "eval_wer", "eval_cer")
    hf_architectures = ("WhisperForConditionalGeneration",)

    def __init__(self, options: Options) -> None:
        self.options = options
        self.language = options.language
        self.processor: Any = None  # bound once the run has loaded it (``bind``)

    @property
    def options_key(self) -> str:
        o = self.options
        return f"{o.language}|{o.max_target_length}|{o.max_seconds}"

    def columns(self, data) -> list[str]:
        return [data.audio_column, data.text_column]

    def file_column(self, data) -> str | None:
        return data.audio_column

    def texts(self, rows, data) -> list[str]:
        return [str(r[data.text_column]) for r in rows]

    def bind(self, processor: Any) -> None:
        """Keep the run's speech processor; its tokenizer's prefix is set to what generate
        starts from (the language, transcribe, no timestamps), so labels and generation agree
        for a pretrained multilingual tokenizer too."""
        self.processor = processor
        tok = getattr(processor, "tokenizer", None)
        if tok is not None and hasattr(tok, "set_prefix_tokens"):
            tok.set_prefix_tokens(
                language=self.language, task="transcribe", predict_timestamps=False
            )

    @property
    def main_input(self) -> str:
        return self.feature_key

    @property
    def feature_key(self) -> str:
        """The model input the processor makes: Whisper's ``input_features``."""
        names = getattr(self.processor.feature_extractor, "model_input_names", None)
        return names[0] if names else "input_features"

    def limits(self) -> tuple[int, float]:
        """(the feature extractor's sample rate, the seconds a clip is cut at: task.max_seconds
        or the extractor's window, whichever is shorter; the extractor cuts at its window)."""
        fe = self.processor.feature_extractor
        window = float(getattr(fe, "n_samples", 0) / fe.sampling_rate) or 30.0
        return int(fe.sampling_rate), min(float(self.options.max_seconds or window), window)

    def encode(self, rows, tokenizer, data, label2id) -> Encoded:
        if tokenizer is not None:
            self.bind(tokenizer)
        rate, limit = self.limits()
        start = self.processor.tokenizer.convert_tokens_to_ids("<|startoftranscript|>")
        kept: list[tuple[str, audio.Notes, list[int], bool]] = []
        for i, row in enumerate(rows):
            path = row[data.audio_column]
            if not isinstance(path, str) or not path:
                raise InputError(
                    f"row {i + 1}: data.audio_column '{data.audio_column}' holds "
                    f"{type(path).__name__} {path!r}, not an audio file path"
                )
            try:
                notes = audio.notes_of(audio.check(path), rate, limit)
            except audio.BadAudio as err:
                skip_bad_file(data, i + 1, path, err)
                continue
            ids = self.processor.tokenizer(str(row[data.text_column])).input_ids
            ids = ids[1:] if ids and ids[0] == start else ids  # the model prepends it
            cut = len(ids) > self.options.max_target_length
            kept.append((path, notes, ids[: self.options.max_target_length], cut))
        return self._arrays(kept)

    def _arrays(self, kept: list[tuple[str, audio.Notes, list[int], bool]]) -> Encoded:
        width = self.options.max_target_length
        labels = np.full((len(kept), width), IGNORE_INDEX, dtype=np.int64)
        for j, (_, _, ids, _) in enumerate(kept):
            labels[j, : len(ids)] = ids
        paths = [p.encode() for p, *_ in kept]
        return Encoded(
            {
                PATH: np.array(paths, dtype="S") if paths else np.zeros(0, dtype="S1"),
                "labels": labels,
                LENGTH: np.array([len(ids) for _, _, ids, _ in kept], dtype=np.int32),
                STEREO: np.array([n.stereo for _, n, _, _ in kept], dtype=bool),
                RATE: np.array([n.resampled_from or 0 for _, n, _, _ in kept], dtype=np.int32),
                CUT: np.array([n.cut for _, n, _, _ in kept], dtype=bool),
                TEXT_CUT: np.array([c for *_, c in kept], dtype=bool),
            }
        )

    def clips(self, paths: Any) -> list[np.ndarray]:
        """Each path decoded to mono float32 at the extractor's rate, cut at the limit."""
        rate, limit = self.limits()
        out = []
        for raw in paths:
            path = raw.decode() if isinstance(raw, bytes) else str(raw)
            try:
                out.append(audio.load(path, rate, limit)[0])
            except audio.BadAudio as err:
                raise InputError(f"{path}: {err} (the file changed since it was checked)") from None
        return out

    def features(self, clips: list[np.ndarray]) -> np.ndarray:
        """The feature extractor's model input of decoded clips (Whisper: log-mel frames,
        padded to its window)."""
        fe = self.processor.feature_extractor
        out = fe(clips, sampling_rate=fe.sampling_rate, return_tensors="np")[self.feature_key]
        return np.ascontiguousarray(out, dtype=np.float32)

    def collate(self, batch, epoch, seed) -> dict[str, np.ndarray]:
        if self.processor is None:
            raise RuntimeError("speech-recognition: collate before bind(processor)")
        labels = batch["labels"]
        mask = np.ones_like(labels)  # decoder inputs: start token, then labels[:-1]
        mask[:, 1:] = labels[:, :-1] != IGNORE_INDEX
        return {
            **batch,
            self.feature_key: self.features(self.clips(batch[PATH])),
            "decoder_attention_mask": mask,
        }

    # by name, as TaskModule calls it: a speech batch has no input_ids / attention_mask
    def forward(  # type: ignore[override]
        self, model, labels, decoder_attention_mask, **inputs
    ) -> tuple[Any, Any]:
        out = model(
            labels=labels,
            decoder_attention_mask=decoder_attention_mask,
            use_cache=False,
            return_dict=True,
            **inputs,
        )
        return out.loss, out.logits

    def prepare_model(self, model: Any, processor: Any) -> None:
        """A Whisper built from a config gets Whisper's generation fields from its tokenizer;
        labels longer than the decoder's positions are refused before training."""
        positions = getattr(model.config, "max_target_positions", None)
        if positions is not None and self.options.max_target_length > positions:
            raise InputError(
                f"task.max_target_length={self.options.max_target_length}: the decoder has "
                f"{positions} positions (config max_target_positions); set it to at most that"
            )
        gc = getattr(model, "generation_config", None)
        if gc is not None and getattr(gc, "no_timestamps_token_id", None) is None:
            model.generation_config = generation_config(
                processor.tokenizer, model.config, self.language
            )
        elif gc is not None and getattr(gc, "lang_to_id", None) and self.language:
            # a pretrained multilingual Whisper: decode in the language it is trained on,
            # to transcribe (its config may leave both to detection)
            gc.language, gc.task = self.language, "transcribe"

    def metrics(self, loss, logits, labels) -> dict[str, Any]:
        return {"loss": loss}

    def transcribe(
        self, model: Any, batch: dict[str, np.ndarray], max_new_tokens: int
    ) -> list[str]:
        """Greedy transcripts of a collated batch: PyTorch ``generate`` with the model's
        generation config, or the ONNX export's own loop (``ortft.families.speech.graphs``)."""
        import torch

        feats = batch[self.feature_key]
        if not isinstance(model, torch.nn.Module):  # the ONNX encoder + decoder
            ids = model.generate(feats, max_new_tokens, num_beams=1)  # greedy, as below
        else:
            hf: Any = model  # a transformers model: generate() is its own
            was_training, device = hf.training, next(hf.parameters()).device
            hf.eval()
            with torch.no_grad():
                ids = (
                    hf.generate(
                        torch.from_numpy(feats).to(device),
                        max_new_tokens=max_new_tokens,
                        do_sample=False,
                        num_beams=1,
                    )
                    .cpu()
                    .numpy()
                )
            hf.train(was_training)
        return self.processor.tokenizer.batch_decode(ids, skip_special_tokens=True)

    @property
    def max_new_tokens(self) -> int:
        """Tokens generate may add: the labels' length less the 4-token prompt it starts from
        (start-of-transcript, language, transcribe, no-timestamps), so prompt and answer fit
        the decoder's positions when max_target_length does."""
        return max(1, self.options.max_target_length - 4)

    def generate_metrics(self, model: Any, tokenizer: Any, encoded: Encoded) -> dict[str, float]:
        n = min(self.options.generate_samples, len(encoded))
        if n == 0:
            return {}
        if tokenizer is not None:
            self.bind(tokenizer)
        hyps, refs, step = [], [], 32  # 32 clips a generate call: bounded feature memory
        for lo in range(0, n, step):
            rows = self.collate(encoded.take(np.arange(lo, min(n, lo + step))), None, 0)
            hyps += self.transcribe(model, rows, self.max_new_tokens)
            refs += self.references(rows["labels"])
        return error_rates(hyps, refs, self.options.normalize)

    def references(self, labels: np.ndarray) -> list[str]:
        """The transcripts (as tokenized, so truncated ones as trained) of label rows."""
        rows = [[t for t in row if t != IGNORE_INDEX] for row in labels]
        return self.processor.tokenizer.batch_decode(rows, skip_special_tokens=True)

    def data_report(self, splits: dict[str, tuple[Any, Any]]) -> dict[str, Any]:
        """summary.json's data.audio: per split, the rows read, the clips used and skipped,
        the stereo clips down-mixed, the clips resampled (by original rate), the clips cut at
        the limit and the transcripts truncated to task.max_target_length."""
        report = {}
        for split, (rows, encoded) in splits.items():
            if rows is None or encoded is None:
                continue
            rates = Counter(int(r) for r in encoded.column(RATE) if r)
            report[split] = {
                "rows": len(rows),
                "used": len(encoded),
                "skipped": len(rows) - len(encoded),
                "stereo": int(np.sum(encoded.column(STEREO))),
                "resampled": {str(k): v for k, v in sorted(rates.items())},
                "cut": int(np.sum(encoded.column(CUT))),
                "transcripts_truncated": int(np.sum(encoded.column(TEXT_CUT))),
            }
            for what, key in (
                ("clips cut at the length limit", "cut"),
                ("transcripts truncated to task.max_target_length", "transcripts_truncated"),
            ):
                if report[split][key]:
                    log.warning("%s: %d %s", split, report[split][key], what)
        return {"audio": report}
