"""Building blocks shared by the recipe's sections (schema.py, hpo.py): the strict section base,
small field types, and the eval metric names."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

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


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


PositiveInt = Annotated[int, Field(ge=1)]


def metric_mode(metric: str, mode: str = "auto") -> str:
    """ "min" or "max": which direction of `metric` is better."""
    if mode != "auto":
        return mode
    return "min" if metric in LOWER_IS_BETTER else "max"
