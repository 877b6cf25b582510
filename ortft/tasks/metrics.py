"""Scores more than one family computes: macro-F1 (sequence, token and image classification).
SQuAD's answer metrics are ``ortft.tasks.squad`` (question answering, seq2seq)."""

from __future__ import annotations

import numpy as np


def macro_f1(pred: np.ndarray, gold: np.ndarray) -> float:
    """Unweighted mean of per-class F1 over the classes seen in either array."""
    f1s = []
    for c in np.union1d(pred, gold):
        tp = np.sum((pred == c) & (gold == c))
        fp = np.sum((pred == c) & (gold != c))
        fn = np.sum((pred != c) & (gold == c))
        f1s.append(2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0)
    return float(np.mean(f1s)) if f1s else 0.0
