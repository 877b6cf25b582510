"""The rows an export is traced and checked on: the parity rows (held-out or synthetic) and the
two-row tracing example. Shared by every export kind (``ortft.export.exporter`` re-exports
them; the embedding family's export imports them here)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def parity_feeds(
    samples: Any, tokenizer: Any, n: int, segments: bool = False
) -> dict[str, np.ndarray]:
    """The rows parity compares on: up to ``n`` held-out rows (with labels when the data has
    them), else synthetic rows of random ids and random lengths, padded at the end.
    ``segments``: the graph takes ``token_type_ids`` (a sentence-pair model): held-out pairs
    keep their own, a synthetic row's second half of tokens is its second text."""
    keys = ("input_ids", "attention_mask", "labels", *(("token_type_ids",) if segments else ()))
    if samples is not None and len(samples):
        batch = samples.take(np.arange(min(n, len(samples))))
        feeds = {k: batch[k] for k in keys if k in batch}
    else:
        rng = np.random.default_rng(0)
        ids = rng.integers(0, len(tokenizer), size=(n, 32), dtype=np.int64)
        mask = (np.arange(32)[None, :] < rng.integers(8, 33, size=(n, 1))).astype(np.int64)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        feeds = {"input_ids": np.where(mask == 1, ids, pad), "attention_mask": mask}
    if segments and "token_type_ids" not in feeds:
        mask = feeds["attention_mask"]
        second = np.cumsum(mask, axis=1) > mask.sum(axis=1, keepdims=True) // 2
        feeds["token_type_ids"] = (second & (mask == 1)).astype(np.int64)
    return feeds


def tracing_example(
    feeds: dict[str, np.ndarray],
    tokenizer: Any,
    names: tuple[str, ...] = ("input_ids", "attention_mask"),
) -> tuple[torch.Tensor, ...]:
    """Two rows of the graph's inputs ``names``, the second partly padded.

    The exporter traces one path through the model: transformers skips building the attention
    mask when a batch has no padding, and a graph traced that way would ignore
    ``attention_mask`` for good. A padded row keeps the masking in the graph.
    """
    rows = {k: feeds[k][:2].copy() for k in names}
    if len(rows["input_ids"]) < 2:
        rows = {k: np.concatenate([v, v]) for k, v in rows.items()}
    cut = max(1, rows["input_ids"].shape[1] // 2)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    for k, v in rows.items():  # padding: the pad id, mask 0, token type 0
        v[1, cut:] = pad if k == "input_ids" else 0
    return tuple(torch.from_numpy(rows[k]) for k in names)


def samples_source(samples: Any) -> str:
    return "eval data" if samples is not None and len(samples) else "synthetic"
