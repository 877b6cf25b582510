"""The rows an export is traced and checked on: the parity rows (held-out or synthetic) and the
two-row tracing example. Shared by every export kind (``ortft.export.exporter`` re-exports
them; ``ortft.export.embedding`` imports them here, below the exporter that routes to it)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def parity_feeds(samples: Any, tokenizer: Any, n: int) -> dict[str, np.ndarray]:
    """The rows parity compares on: up to ``n`` held-out rows (with labels when the data has
    them), else synthetic rows of random ids and random lengths, padded at the end."""
    if samples is not None and len(samples):
        batch = samples.take(np.arange(min(n, len(samples))))
        return {k: batch[k] for k in ("input_ids", "attention_mask", "labels") if k in batch}
    rng = np.random.default_rng(0)
    ids = rng.integers(0, len(tokenizer), size=(n, 32), dtype=np.int64)
    mask = (np.arange(32)[None, :] < rng.integers(8, 33, size=(n, 1))).astype(np.int64)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return {"input_ids": np.where(mask == 1, ids, pad), "attention_mask": mask}


def tracing_example(feeds: dict[str, np.ndarray], tokenizer: Any) -> tuple[torch.Tensor, ...]:
    """Two rows, the second partly padded.

    The exporter traces one path through the model: transformers skips building the attention
    mask when a batch has no padding, and a graph traced that way would ignore
    ``attention_mask`` for good. A padded row keeps the masking in the graph.
    """
    ids = feeds["input_ids"][:2].copy()
    mask = feeds["attention_mask"][:2].copy()
    if len(ids) < 2:
        ids, mask = np.concatenate([ids, ids]), np.concatenate([mask, mask])
    cut = max(1, ids.shape[1] // 2)
    mask[1, cut:] = 0
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids[1, cut:] = pad
    return torch.from_numpy(ids), torch.from_numpy(mask)


def samples_source(samples: Any) -> str:
    return "eval data" if samples is not None and len(samples) else "synthetic"
