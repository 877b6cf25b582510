"""Question answering's spans: each token's place in the context, the model's start and end
logits as one tensor, and the best span of them (what eval scores and ``ortft predict`` gives)."""

from __future__ import annotations

from typing import Any

import numpy as np

MAX_ANSWER_TOKENS = 30
# the model's fields and the export's outputs, as Optimum's question-answering exports name
# them and transformers.js's pipeline reads them (each [batch, sequence])
OUTPUTS = ("start_logits", "end_logits")


def context_char_spans(enc: Any, i: int) -> np.ndarray:
    """[sequence, 2] character offsets into the context of row ``i``'s context tokens; -1 on
    every other position (special tokens, the question, padding)."""
    seq = enc.sequence_ids(i)
    out = np.full((len(seq), 2), -1, dtype=np.int64)
    for t, (s, offsets) in enumerate(zip(seq, enc["offset_mapping"][i], strict=True)):
        if s == 1:
            out[t] = offsets
    return out


def span_logits(out: Any) -> Any:
    """A question-answering model's output as one tensor, [batch, 2 (start, end), sequence]: what
    the loss, parity and ``ortft eval`` read. The export keeps the two apart (``OUTPUTS``)."""
    import torch

    return torch.stack([getattr(out, name) for name in OUTPUTS], dim=1)


def best_span(
    start_logits: np.ndarray, end_logits: np.ndarray, allowed: np.ndarray
) -> tuple[int, int] | None:
    """The (start, end) with the highest start + end score among the ``allowed`` positions (the
    context's tokens), end >= start, at most 30 tokens; None when no position is allowed."""
    n = len(start_logits)
    score = start_logits[:, None].astype(np.float64) + end_logits[None, :]
    i, j = np.indices((n, n))
    ok = (j >= i) & (j - i < MAX_ANSWER_TOKENS) & allowed[:, None] & allowed[None, :]
    if not ok.any():
        return None
    s, e = np.unravel_index(int(np.argmax(np.where(ok, score, -np.inf))), score.shape)
    return int(s), int(e)
