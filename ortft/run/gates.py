"""Quality gates: `eval.accuracy>=0.90`, checked against a run summary.

A gate names a metric, a comparison and a threshold. Metric names:
  eval.<m>        summary.metrics.eval_<m>   (accuracy, f1_macro, loss, perplexity)
  train.loss      summary.metrics.train_loss
  throughput.<m>  summary.throughput.<m>     (samples_per_s, tokens_per_s, first_step_s)
  export.<m>      summary.export.parity.<m>  (max_abs_diff, prediction_agreement)
  <dotted path>   any other number in summary.json (e.g. wall_time_s, steps)
A failed gate makes the command exit 3; the results are recorded in summary.json.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from ortft.recipe.gates import OPS, Gate, parse
from ortft.run.summary import RunSummary

__all__ = ["Gate", "GateResult", "as_dicts", "check", "lookup", "parse"]


@dataclass(frozen=True)
class GateResult:
    gate: str
    metric: str
    op: str
    threshold: float
    value: float | None
    passed: bool
    reason: str | None = None

    def line(self) -> str:
        mark = "PASS" if self.passed else "FAIL"
        shown = "missing" if self.value is None else f"{self.value:.6g}"
        why = f" ({self.reason})" if self.reason else ""
        return f"gate {mark}  {self.metric} = {shown}  (needs {self.op} {self.threshold:g}){why}"


def lookup(summary: RunSummary, metric: str) -> float | None:
    """The number ``metric`` (a user's dotted name, see the module docstring) names, or None."""
    head, _, rest = metric.partition(".")
    if head == "eval" and rest:
        value: Any = summary.metrics.get(f"eval_{rest}")
    elif head == "train" and rest:
        value = summary.metrics.get(f"train_{rest}")
    elif head == "throughput" and rest:
        value = summary.throughput.get(rest)
    elif head == "export" and rest:
        value = ((summary.export or {}).get("parity") or {}).get(rest)
    else:  # any other dotted path, resolved in summary.json's own layout
        value = summary.to_dict()
        for part in metric.split("."):
            value = value.get(part) if isinstance(value, dict) else None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def check(gates: list[Gate], summary: RunSummary | Mapping[str, Any]) -> list[GateResult]:
    """Each gate against ``summary`` (a dict too: summary.json as read, or an older caller's)."""
    summary = RunSummary.coerce(summary)
    results = []
    for g in gates:
        value = lookup(summary, g.metric)
        if value is None:
            results.append(
                GateResult(
                    str(g),
                    g.metric,
                    g.op,
                    g.threshold,
                    None,
                    False,
                    "the run did not produce this metric",
                )
            )
        elif math.isnan(value):
            results.append(GateResult(str(g), g.metric, g.op, g.threshold, value, False, "NaN"))
        else:
            results.append(
                GateResult(
                    str(g), g.metric, g.op, g.threshold, value, bool(OPS[g.op](value, g.threshold))
                )
            )
    return results


def as_dicts(results: list[GateResult]) -> list[dict[str, Any]]:
    return [asdict(r) for r in results]
