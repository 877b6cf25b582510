"""Backends run the model's forward/backward. Each is one file; the loop sees only this protocol.

- ``torch``: eager PyTorch, the module unchanged.
- ``ort``: ONNX Runtime through ORTModule (``onnxruntime-training``), strict about fallback.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from torch import nn


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

    def as_dict(self) -> dict[str, Any]:
        return {
            "requested": self.requested,
            "used": self.used,
            "fallback": self.fallback,
            "fallback_reason": self.fallback_reason,
            "ort_exports": self.ort_exports,
            "pytorch_kernels": self.pytorch_kernels,
            "notes": self.notes,
        }


class Backend(Protocol):
    name: str
    attn_implementation: str  # what the HF model must be built with for this backend

    def wrap(self, module: nn.Module, run_dir: Path) -> nn.Module:
        """Return the module the loop calls (it shares parameters with ``module``)."""

    def after_step(self, wrapped: nn.Module) -> None:
        """Called after each forward/backward: verify the backend really ran (raise if not)."""

    def report(self) -> BackendReport: ...


def get(name: str, options: Any) -> Backend:
    """The backend for ``backend.name``; heavy imports happen inside the backend module."""
    if name == "torch":
        from ortft.backends.torch import TorchBackend

        return TorchBackend()
    if name == "ort":
        from ortft.backends.ort import OrtBackend

        return OrtBackend(options)
    raise ValueError(f"unknown backend {name}")
