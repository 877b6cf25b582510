"""Quality gates: `eval.accuracy>=0.90`, checked against a run summary.

A gate names a metric, a comparison and a threshold. Metric names:
  eval.<m>        summary.metrics.eval_<m>   (accuracy, f1_macro, loss, perplexity)
  train.loss      summary.metrics.train_loss
  throughput.<m>  summary.throughput.<m>     (samples_per_s, tokens_per_s, first_step_s)
  export.<m>      summary.export.parity.<m>  (max_abs_diff, prediction_agreement)
  <dotted path>   any other number in summary.json (e.g. wall_time_s, steps)
A failed gate makes the command exit 3; the results are recorded in summary.json. The export's
own generation and preprocess checks are gate results too (``export_checks``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from ortft.core.errors import GateError
from ortft.core.reports import ExportReport
from ortft.recipe.gates import OPS, Gate, parse
from ortft.run.summary import RunSummary

__all__ = [
    "Gate",
    "GateResult",
    "as_dicts",
    "check",
    "export_checks",
    "lookup",
    "parse",
    "raise_failed",
]

log = logging.getLogger("ortft")


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


# ---- the export's own checks as gate results, and the verdict


def export_checks(export: ExportReport) -> list[GateResult]:
    """The export's generation and preprocess checks as gate results (those it ran)."""
    return _generation(export) + _preprocess(export)


def _generation(export: ExportReport) -> list[GateResult]:
    """The export's generation check as a gate result (none when the export has no such check):
    the ONNX loop against PyTorch's ``generate`` with the model's generation config."""
    gen = export.get("generation")
    if gen is None:
        return []
    ok, why = bool(gen["passed"]), None
    if not ok:
        why = (
            f"{gen['mismatches']} prompt(s) diverged from generate, max |diff| "
            f"{gen['max_abs_diff']:.2e}, {gen['steps_compared']} steps compared"
        )
    return [_passed("export.generation.passed", ok, why)]


def _preprocess(export: ExportReport) -> list[GateResult]:
    """An image export's preprocess.onnx check as a gate result (none without that graph): the
    graph against the image processor on the held-out images."""
    pre = export.get("preprocess")
    if pre is None or not pre.get("exported"):
        return []
    ok, why = bool(pre["passed"]), None
    if not ok:
        why = pre.get("problem") or (
            f"max |diff| {pre['max_abs_diff']:.2e} > {pre['tolerance']:.2e} from the image processor"
        )
    return [_passed("export.preprocess.passed", ok, why)]


def _passed(metric: str, ok: bool, why: str | None) -> GateResult:
    """A pass/fail check as the gate ``<metric> == 1``."""
    return GateResult(f"{metric}==1", metric, "==", 1.0, float(ok), ok, why)


def raise_failed(results: list[GateResult], summary: RunSummary) -> None:
    """One line per gate on stderr; GateError (exit 3) if any failed."""
    for res in results:
        (log.info if res.passed else log.error)("%s", res.line())
    failed = [res for res in results if not res.passed]
    if failed:
        raise GateError(
            f"{len(failed)} of {len(results)} quality gate(s) failed: "
            + ", ".join(res.gate for res in failed),
            summary=summary,
        )
