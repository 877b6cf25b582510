"""Batches: which rows, in which order, and how long each batch is.

The tokenized arrays are stored padded to ``data.max_length`` with each row's real length
(``_length``); a batch is cut to the length its rows need (``data.padding``):

- ``longest``: the batch's longest row, rounded up to ``pad_to_multiple_of`` (default 8);
- ``buckets``: the smallest of a few fixed lengths that fits it (few distinct shapes);
- ``max_length``: always ``max_length`` (every step the same shape).

Padding is right-sided everywhere (the tokenizers pad right), so cutting columns off the right
removes only padding: the real tokens, their positions and labels are unchanged. Measured on the
bench recipe bert-cls (Rotten Tomatoes snippets, max_length 128): two thirds of every
max_length batch was padding.

The order is a pure function of the seed and the epoch (and resume starts mid-epoch at the same
micro-batch), so a resumed run sees the same batches, in the same order, with the same shapes.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from ortft.core.constants import IGNORE_INDEX
from ortft.data.encoded import Encoded

LENGTH = "_length"  # each row's real token count, stored with the tokenized arrays
GROUP_BATCHES = 50  # group_by_length: batches per sorted group (transformers uses 50 too)


@dataclass(frozen=True)
class Padding:
    mode: str = "max_length"  # longest | buckets | max_length
    max_length: int = 0
    multiple: int = 8
    buckets: tuple[int, ...] = ()

    @classmethod
    def of(cls, data: object) -> Padding:
        """The padding a recipe's ``data`` section asks for."""
        m = data.max_length  # type: ignore[attr-defined]
        buckets = data.buckets or [m // 4, m // 2, 3 * m // 4, m]  # type: ignore[attr-defined]
        return cls(
            data.padding,  # type: ignore[attr-defined]
            m,
            data.pad_to_multiple_of,  # type: ignore[attr-defined]
            tuple(sorted({b for b in buckets if b > 0} | {m})),
        )

    def length(self, longest: int) -> int:
        """The length of a batch whose longest row has ``longest`` real tokens."""
        if self.mode == "max_length" or not self.max_length:
            return self.max_length
        if self.mode == "buckets":
            return next(b for b in self.buckets if b >= longest)
        return min(
            self.max_length, max(self.multiple, math.ceil(longest / self.multiple) * self.multiple)
        )


def lengths(encoded: Encoded) -> np.ndarray:
    """Each row's real length: stored at tokenization, or counted from the attention mask
    (1 for rows without one: an image is one example, never cut)."""
    if LENGTH in encoded.arrays:
        return encoded.arrays[LENGTH]
    if "attention_mask" not in encoded.arrays:
        return np.ones(len(encoded), dtype=np.int32)
    return encoded.arrays["attention_mask"].sum(axis=1)


def with_lengths(encoded: Encoded) -> Encoded:
    """``encoded`` with ``_length`` stored (what the tokenized cache keeps)."""
    if LENGTH not in encoded.arrays:
        encoded.arrays[LENGTH] = lengths(encoded).astype(np.int32)
    return encoded


# arrays with one value per input position: cut with input_ids when a batch is shortened
ALIGNED = ("input_ids", "attention_mask", "token_type_ids", "labels")


@runtime_checkable
class AlignsKeys(Protocol):
    """A task whose arrays along the input positions are not ``ALIGNED`` (question answering's
    spans, seq2seq's source only, speech's labels, none for images)."""

    @property
    def aligned_keys(self) -> tuple[str, ...]: ...


def aligned_keys(task: object) -> tuple[str, ...]:
    """The arrays of ``task``'s batches cut with its longest row (``AlignsKeys``; ``ALIGNED``)."""
    return task.aligned_keys if isinstance(task, AlignsKeys) else ALIGNED


def cut(batch: dict[str, np.ndarray], padding: Padding, aligned: tuple[str, ...]) -> dict:
    """``batch`` with its ``aligned`` arrays (one value per input position) cut to the length
    ``padding`` gives its longest row; other arrays as they are."""
    if padding.mode == "max_length" or LENGTH not in batch:
        return batch
    n = padding.length(int(batch[LENGTH].max()))
    # contiguous copies: a column slice is a strided view, and torch.from_numpy keeps the
    # strides, which .view() inside transformers' losses refuses
    return {
        k: np.ascontiguousarray(v[:, :n]) if k in aligned and v.ndim >= 2 and v.shape[1] > n else v
        for k, v in batch.items()
    }


def batches_per_epoch(n: int, batch_size: int) -> int:
    return n // batch_size  # drop the last partial batch: every step has batch_size rows


def epoch_order(
    encoded: Encoded, batch_size: int, seed: int, epoch: int, shuffle: bool, group_by_length: bool
) -> np.ndarray:
    """The row order of ``epoch``: seeded; with ``group_by_length``, each group of
    ``GROUP_BATCHES`` batches sorted by length (longest first), the groups in seeded order."""
    n = len(encoded)
    order = np.random.default_rng(seed + epoch).permutation(n) if shuffle else np.arange(n)
    if not group_by_length:
        return order
    size, rows = batch_size * GROUP_BATCHES, lengths(encoded)
    groups = [order[i : i + size] for i in range(0, n, size)]
    # stable: rows of equal length keep their seeded order
    return np.concatenate([g[np.argsort(-rows[g], kind="stable")] for g in groups])


def train_batches(
    encoded: Encoded,
    batch_size: int,
    seed: int,
    shuffle: bool,
    start_micro: int = 0,
    group_by_length: bool = False,
) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
    """Yield (epoch, batch) forever from micro-batch number ``start_micro`` on; full-width rows
    (the loop cuts them with ``cut`` after the task's collate, so that masked-lm's masking of a
    row does not depend on the length of the batch it lands in)."""
    per_epoch = batches_per_epoch(len(encoded), batch_size)
    micro = start_micro
    while True:
        epoch, index = divmod(micro, per_epoch)
        order = epoch_order(encoded, batch_size, seed, epoch, shuffle, group_by_length)
        for b in range(index, per_epoch):
            yield epoch, encoded.take(order[b * batch_size : (b + 1) * batch_size])
        micro = (epoch + 1) * per_epoch


def eval_batches(encoded: Encoded, batch_size: int) -> Iterator[dict[str, np.ndarray]]:
    """All eval rows in order; the last batch is padded with copies and marked by ``_valid``."""
    n = len(encoded)
    for start in range(0, n, batch_size):
        idx = np.arange(start, min(start + batch_size, n))
        valid = len(idx)
        if valid < batch_size:  # keep batch_size rows: pad with the last row, ignore it after
            idx = np.concatenate([idx, np.full(batch_size - valid, idx[-1])])
        batch = encoded.take(idx)
        batch["labels"][valid:] = IGNORE_INDEX  # padded rows are ignored by the loss
        batch["_valid"] = np.array(valid)
        yield batch
