"""Backends run the model's forward/backward. Each is one file; the loop sees only this protocol.

- ``torch``: eager PyTorch, the module unchanged.
- ``ort``: ONNX Runtime through ORTModule (``onnxruntime-training``), strict about fallback.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from torch import nn

from ortft.run.summary import BackendReport  # noqa: F401 (re-export: backends build their report)


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
