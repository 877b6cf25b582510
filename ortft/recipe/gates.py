"""The gate grammar: ``metric>=number`` (operators >=, <=, >, <, ==, !=). The recipe validates its
``gates`` with it before anything runs; ``ortft.run.gates`` checks them against a summary."""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass

from ortft.core.errors import UsageError

OPS = {
    ">=": operator.ge,
    "<=": operator.le,
    ">": operator.gt,
    "<": operator.lt,
    "==": operator.eq,
    "!=": operator.ne,
}
_GATE = re.compile(r"^\s*([A-Za-z_][\w.]*)\s*(>=|<=|==|!=|>|<)\s*([-+0-9.eE]+|inf|-inf)\s*$")


@dataclass(frozen=True)
class Gate:
    metric: str
    op: str
    threshold: float

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.threshold:g}"


def parse(text: str) -> Gate:
    m = _GATE.match(text)
    if not m:
        raise UsageError(
            f"gate '{text}' must look like metric>=number, e.g. eval.accuracy>=0.9 "
            f"(operators: {' '.join(OPS)})"
        )
    try:
        threshold = float(m.group(3))
    except ValueError:
        raise UsageError(f"gate '{text}': '{m.group(3)}' is not a number") from None
    return Gate(metric=m.group(1), op=m.group(2), threshold=threshold)
