"""The module wrapper a PyTorch engine trains through: eager PyTorch (``eager.py``) or ORTModule
(``ortft.backends.ortmodule``). Each has ``wrap`` / ``after_step`` / ``report``; the engine and
the ``auto`` probe (``auto.py``) both pick one here by name."""

from __future__ import annotations

from typing import Any


def wrapper(name: str, options: Any) -> Any:
    """The module wrapper for ``name``: ``wrap`` / ``after_step`` / ``report`` (eager.py, ortmodule/wrapper.py)."""
    if name == "torch":
        from ortft.backends.torch.eager import TorchBackend

        return TorchBackend()
    if name == "ort":
        from ortft.backends.ortmodule.wrapper import OrtBackend

        return OrtBackend(options)
    raise ValueError(f"unknown module wrapper {name}")
