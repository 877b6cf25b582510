"""The module wrapper a PyTorch engine trains through: eager PyTorch (``eager.py``, compiled or
not) or ORTModule (``ortft.backends.ortmodule``). Each has ``wrap`` / ``outer`` /
``after_step`` / ``report``; the engine and the ``auto`` probe (``auto.py``) both pick one here
by name."""

from __future__ import annotations

from typing import Any


def wrapper(
    name: str, options: Any, compile: bool | None = None, compile_key: str | None = None
) -> Any:
    """The module wrapper for ``name`` (eager.py, ortmodule/wrapper.py); ``compile``: the torch
    route's, where the probe chose it (default: ``backend.compile: true``); ``compile_key``:
    what a compiled route remembers its compile time under (``compiled.route_key``; the probe
    records its own)."""
    if name == "torch":
        from ortft.backends.torch.eager import TorchBackend

        compiled = options.compile is True if compile is None else compile
        return TorchBackend(
            compile=compiled,
            unpad=options.unpad,
            dropout_masks=options.dropout_masks,
            compile_key=compile_key,
        )
    if name == "ort":
        from ortft.backends.ortmodule.wrapper import OrtBackend

        return OrtBackend(options)
    raise ValueError(f"unknown module wrapper {name}")
