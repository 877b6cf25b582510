"""A run's splits: the train and eval rows its ``data:`` section names (``load_splits``: read,
held out, capped), then their token arrays (``encode_splits``: from the tokenized cache, or as
a stream tokenizes them).

Rows are read by ``ortft/data/rows.py`` (a stream's by ``ortft/data/streaming.py``), tokenized
by ``ortft/data/tokenized.py``. What these need of the task are the readers of
``ortft/data/checks.py`` (its columns, labels and files) and ``Encoder``
(``ortft/data/encoded.py``).
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ortft.data import streaming, tokenized
from ortft.data.checks import RowColumns, file_column
from ortft.data.encoded import Encoded, Encoder
from ortft.data.paths import resolve_input_path
from ortft.data.rows import Rows, read_rows, stat_key
from ortft.data.spec import DataSection

log = logging.getLogger("ortft")


@dataclass
class RawSplits:
    train: Any  # Rows, or streaming.StreamRows (data.streaming)
    eval: Rows | None
    fingerprint: str  # identifies the input files for the tokenization cache


def _fingerprint(base_dir: Path, values: list[str | None]) -> str:
    h = hashlib.sha256()
    for value in values:
        if not value:
            continue
        h.update(value.encode())
        try:
            path = resolve_input_path(value, base_dir)
        except Exception:  # noqa: BLE001
            continue
        if path.exists():
            h.update(stat_key(path).encode())
    return h.hexdigest()[:16]


def load_splits(spec: DataSection, base_dir: Path, task: RowColumns, *, seed: int) -> RawSplits:
    """The train and eval rows of ``spec`` (relative paths resolve against ``base_dir``);
    ``seed``: the seeded shuffle that picks the rows ``data.eval_fraction`` holds out."""
    if spec.streaming:  # train rows read as they stream (ortft/data/streaming.py); eval stored
        return _stream_splits(spec, base_dir, task)
    train = read_rows(spec, base_dir, spec.train, spec.split, task)
    evals: Rows | None = None
    if spec.eval:
        evals = read_rows(spec, base_dir, spec.eval, spec.eval_split or "validation", task)
    elif spec.eval_split:  # another split of train's source: a saved DatasetDict, the Hub
        evals = read_rows(spec, base_dir, spec.train, spec.eval_split, task, of_splits=True)
    elif spec.eval_fraction > 0:
        # a seeded shuffle, then the tail is held out: the same split on every run
        order = np.random.default_rng(seed).permutation(len(train))
        n_eval = max(1, int(round(len(train) * spec.eval_fraction)))
        evals, train = train.select(order[:n_eval]), train.select(order[n_eval:])
    if spec.max_train_samples and spec.max_train_samples < len(train):
        train = train.select(range(spec.max_train_samples))
    if evals is not None and spec.max_eval_samples and spec.max_eval_samples < len(evals):
        evals = evals.select(range(spec.max_eval_samples))
    fp = _fingerprint(base_dir, [spec.train, spec.eval])
    return RawSplits(train=train, eval=evals or None, fingerprint=fp)


def _stream_splits(spec: DataSection, base_dir: Path, task: RowColumns) -> RawSplits:
    train: Any = streaming.read(spec, base_dir, spec.train, spec.split, task)
    if spec.max_train_samples:
        train.dataset = train.dataset.take(spec.max_train_samples)
    evals = None
    if spec.eval:
        evals = read_rows(spec, base_dir, spec.eval, spec.eval_split or "validation", task)
    elif spec.eval_split:
        evals = read_rows(spec, base_dir, spec.train, spec.eval_split, task, of_splits=True)
    if evals is not None and spec.max_eval_samples and spec.max_eval_samples < len(evals):
        evals = evals.select(range(spec.max_eval_samples))
    return RawSplits(train=train, eval=evals, fingerprint=_fingerprint(base_dir, [spec.eval]))


def encode_splits(
    task: Encoder, raw: RawSplits, tokenizer: Any, spec: DataSection, label2id: Any
) -> tuple[Encoded, tokenized.ArrowEncoded | None]:
    """Train and eval arrays (each from the cache when a previous run made them); logs sizes."""
    t0 = time.perf_counter()
    if isinstance(raw.train, streaming.StreamRows):  # tokenized as it is read, never stored
        train: Any = streaming.StreamEncoded(raw.train, task, tokenizer, spec, label2id)
        hit = False
    else:
        train, hit = tokenized.encode(
            task, raw.train, tokenizer, spec, label2id, [raw.fingerprint, "train"], spec.train
        )
    evals = (
        tokenized.encode(
            task,
            raw.eval,
            tokenizer,
            spec,
            label2id,
            [raw.fingerprint, "eval"],
            spec.eval or f"{spec.train}{tokenized.HELD_OUT}",
        )[0]
        if raw.eval is not None
        else None
    )
    modality = getattr(task, "modality", "text")
    text = file_column(task, spec) is None  # images and audio: files checked, not tokenized
    done = "tokenized" if text else "files checked"
    how = (
        "streamed: tokenized as read"
        if spec.streaming
        else f"{done} earlier: cache hit"
        if hit
        else f"{done} in {time.perf_counter() - t0:.1f}s"
    )
    log.info(
        "data: %s train / %d eval examples %s (%s)",
        "a stream of" if spec.streaming else len(train),
        len(evals) if evals is not None else 0,
        f"of {spec.max_length} tokens" if text else f"({modality} files, decoded per batch)",
        how,
    )
    return train, evals
