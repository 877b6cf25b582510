"""SQuAD v1.1's answer metrics: exact match and word-overlap F1 over normalized answer text.

A port of ``normalize_answer``, ``exact_match_score`` and ``f1_score`` from the official SQuAD
v1.1 evaluation script (``evaluate-v1.1.py``, Rajpurkar et al. 2016, distributed with the
dataset at rajpurkar.github.io/SQuAD-explorer). Normalization: lowercase, drop ASCII
punctuation (``string.punctuation``), drop the articles a / an / the as whole words, collapse
whitespace. F1 is over the multiset of normalized words; as in v1.1, no shared word (also an
empty prediction or answer) gives 0. The script takes the max over several gold answers; ortft's
data has one answer per row, so these take one.
"""

from __future__ import annotations

import re
import string
from collections import Counter

_PUNCTUATION = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """Lower text and remove punctuation, articles and extra whitespace (the script's order)."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def f1(prediction: str, gold: str) -> float:
    pred, ref = normalize_answer(prediction).split(), normalize_answer(gold).split()
    same = sum((Counter(pred) & Counter(ref)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(ref)
    return 2 * precision * recall / (precision + recall)
