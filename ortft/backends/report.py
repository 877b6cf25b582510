"""What an engine reports about itself: the backend that really ran (and why it fell back, when it
did) and the precision it trained in. summary.json's ``backend`` and ``precision`` blocks; the
bench tables. Stdlib only: the loop and the tools read them without PyTorch."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


def split_known(cls: type, d: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the keys that are fields of ``cls``, the rest) — the rest go to ``extra``."""
    names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
    known = {k: v for k, v in d.items() if k in names}
    return known, {k: v for k, v in d.items() if k not in names}


@dataclass
class BackendReport:
    """What actually ran: goes into summary.json and the bench tables."""

    requested: str
    used: str
    fallback: bool = False
    fallback_reason: str | None = None
    ort_exports: int = 0
    # ORT graph nodes run as PyTorch kernels, per op (backend.pytorch_kernels)
    pytorch_kernels: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # merged flat into the JSON: "probe" (backend.name=auto), "peak_rss_mb" (ort-ondevice)
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "requested": self.requested,
            "used": self.used,
            "fallback": self.fallback,
            "fallback_reason": self.fallback_reason,
            "ort_exports": self.ort_exports,
            "pytorch_kernels": self.pytorch_kernels,
            "notes": self.notes,
            **self.extra,
        }

    to_dict = as_dict

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> BackendReport:
        known, extra = split_known(cls, d)
        known.setdefault("requested", "")
        known.setdefault("used", "")
        return cls(**known, extra=extra)


@dataclass
class Precision:
    dtype: str = "fp32"
    skipped_steps: int = 0  # fp16 steps skipped by loss scaling (an overflow), not an error
    requested: str | None = None  # the recipe's precision.dtype, when it was auto
    reason: str | None = None  # why auto chose dtype
    weights: str = "fp32"  # bf16: a bf16 copy trained, the optimizer stepped fp32 weights

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"dtype": self.dtype, "skipped_steps": self.skipped_steps}
        if self.weights != "fp32":
            out["weights"] = self.weights
        if self.requested is not None:
            out.update(requested=self.requested, reason=self.reason)
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Precision:
        known, _ = split_known(cls, d)
        return cls(**known)
