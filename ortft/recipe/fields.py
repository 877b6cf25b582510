"""Building blocks shared by the recipe's sections (schema.py, hpo.py): the strict section base
and small field types (``ortft/core/section.py``, re-exported here), and the eval metric names."""

from __future__ import annotations

from typing import Literal

from ortft.core.section import PositiveInt, Section

__all__ = ["LOWER_IS_BETTER", "EvalMetric", "PositiveInt", "Section", "metric_mode"]

# Eval metrics as summary.json names them; which ones a task has is its Task.eval_metrics
# (checked in rules.eval_users).
EvalMetric = Literal[
    "eval_loss",
    "eval_accuracy",
    "eval_f1_macro",
    "eval_perplexity",
    "eval_f1",
    "eval_exact_match",
    "eval_token_f1",
]
LOWER_IS_BETTER = ("eval_loss", "eval_perplexity")


def metric_mode(metric: str, mode: str = "auto") -> str:
    """ "min" or "max": which direction of `metric` is better."""
    if mode != "auto":
        return mode
    return "min" if metric in LOWER_IS_BETTER else "max"
