"""``ortft predict`` for speech recognition: the transcript of each audio file.

Input (``--input``): as for images (``ortft.inference.input_files.read``): a text file of
audio paths, one per line, relative to the file's folder (``-``: stdin); a folder: every
audio file under it (``EXTENSIONS``), sorted by path; or one audio file. Every file is decoded
whole once before anything is printed (``ortft.families.speech.audio.check``), so a missing, empty or
unreadable file stops the command with one line, ``paths.txt:3: a.wav: empty file (0
bytes)``, exit 2, and no transcripts.

A clip longer than the model's window (Whisper: 30 s; the run's ``task.max_seconds`` when
set) is cut there, not chunked: the transcript covers its first 30 s, stderr says so, and the
result has ``cut: true``. Chunked long-form decoding (Whisper's sliding window with timestamp
tokens) is not done; cut and transcribe the parts yourself.

Output, one object per file in input order: ``index``, ``input`` (the path as given),
``text`` (the transcript), ``seconds`` (the clip's duration) and ``cut``.

PyTorch (a run dir or ``final/``): each clip decoded to mono at the feature extractor's rate
(``audio.load``), the feature extractor's log-mel frames, ``model.generate`` with the model's
generation config (greedy). An ONNX export: ``features.onnx`` on each clip's samples, then the
encoder and the decoder with its KV cache and the same generation config
(``ortft.families.speech.graphs``): what a client deploys.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import numpy as np

from ortft.core.errors import InputError
from ortft.core.reports import Prediction
from ortft.families.speech import audio
from ortft.inference import input_files
from ortft.inference.evaluate import SavedModel

log = logging.getLogger("ortft")

# what a folder's "audio file" is: the formats soundfile (libsndfile) decodes that clips come in
EXTENSIONS = frozenset((".wav", ".flac", ".ogg", ".oga", ".opus", ".aiff", ".aif", ".au"))


def check(items: list[input_files.Item]) -> list[audio.Info]:
    """Every file decodes, before the first transcript is printed."""
    infos = []
    for item in items:
        try:
            infos.append(audio.check(str(item.path)))
        except audio.BadAudio as err:
            raise InputError(f"{item.where}: {err}") from None
    return infos


def _clips(m: SavedModel, chunk: list[input_files.Item]) -> list[np.ndarray]:
    rate, limit = m.spec.limits()
    out = []
    for item in chunk:
        try:
            out.append(audio.load(str(item.path), rate, limit)[0])
        except audio.BadAudio as err:  # it decoded in check(): the file changed since
            raise InputError(f"{item.where}: {err} (the file changed while predicting)") from None
    return out


def transcribe(m: SavedModel, clips: list[np.ndarray], max_new_tokens: int) -> list[str]:
    """Transcripts of decoded clips: the export's graphs (features.onnx when it has one), or
    the PyTorch model through the task's own feature extraction and ``generate``."""
    task = m.spec
    if m.runtime == "onnxruntime" and getattr(m._model, "features", None) is not None:
        ids = m._model.transcribe(clips, max_new_tokens)
        return task.processor.tokenizer.batch_decode(ids, skip_special_tokens=True)
    return task.transcribe(m._model, {task.feature_key: task.features(clips)}, max_new_tokens)


def run(
    m: SavedModel, input_path: str, batch_size: int, max_new_tokens: int
) -> Iterator[Prediction]:
    """One result per file ``--input`` names; every file checked first."""
    items = input_files.read(input_path, EXTENSIONS, "audio")
    infos = check(items)
    rate, limit = m.spec.limits()
    # the prompt (at most 4 tokens: start, language, task, no-timestamps) and the transcript
    # fit the decoder's positions (generate refuses more)
    new = min(max_new_tokens, int(m.config.max_target_positions) - 4)
    for item, info in zip(items, infos, strict=True):
        if info.seconds > limit:
            log.warning(
                "%s: %.1f s; transcribing its first %.0f s (the model's window; longer clips "
                "are cut, not chunked)",
                item.where,
                info.seconds,
                limit,
            )
    return _results(m, items, infos, batch_size, new, limit)


def _results(m, items, infos, batch_size, new, limit) -> Iterator[Prediction]:
    for start in range(0, len(items), batch_size):
        chunk = items[start : start + batch_size]
        texts = transcribe(m, _clips(m, chunk), new)
        for i, (item, text) in enumerate(zip(chunk, texts, strict=True)):
            seconds = infos[start + i].seconds
            yield {
                "index": start + i,
                "input": item.shown,
                "text": text.strip(),
                "seconds": round(seconds, 3),
                "cut": seconds > limit,
            }
