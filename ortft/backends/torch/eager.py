"""PyTorch: the baseline, with transformers' default (sdpa) attention, eager or compiled.

``backend.compile: true`` (or the ``auto`` probe's choice) runs the forward through
``torch.compile`` (``compiled.py``): the engine puts ``outer`` around its forward, outside DDP.

A bench-only variant is switched on by an environment variable that ``ortft bench`` sets for
its worker processes (not a recipe field: a recipe describes a training run, this describes a
measurement): ``ORTFT_TORCH_ATTN=eager``, eager attention, the same model code ORTModule runs.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ortft.backends.report import BackendReport

if TYPE_CHECKING:
    from torch import nn


class TorchBackend:
    name = "torch"

    def __init__(self, compile: bool = False) -> None:
        self.attn_implementation = os.environ.get("ORTFT_TORCH_ATTN", "sdpa")
        if self.attn_implementation not in ("sdpa", "eager"):
            raise ValueError(f"ORTFT_TORCH_ATTN={self.attn_implementation}: use sdpa or eager")
        self.compile = compile
        self.clock: Any = None  # compiled: the first step's time (compiled.CompileClock)

    def wrap(self, module: nn.Module, run_dir: Path) -> nn.Module:
        return module  # evaluation, saving and export use the module itself

    def outer(self, forward: nn.Module) -> Any:
        """The training forward: compiled around DDP (or the module) when compile is on."""
        if not self.compile:
            return forward
        from ortft.backends.torch import compiled

        self.clock = compiled.CompileClock()
        return compiled.compile_forward(forward)

    def before_forward(self, seed: int, micro_step: int) -> None:
        if self.clock is not None:
            self.clock.start()  # torch's own RNG state is in every checkpoint

    def after_step(self, wrapped: nn.Module) -> None:
        if self.clock is not None:
            self.clock.stop()

    def report(self) -> BackendReport:
        notes, extra = [], {}
        if self.attn_implementation != "sdpa":
            notes.append(f"attention={self.attn_implementation} (ORTFT_TORCH_ATTN)")
        if self.compile:
            extra["compile"] = self.clock.record() if self.clock is not None else {}
            notes.append(f"torch.compile ({extra['compile'].get('compiler')}, dynamic shapes)")
        return BackendReport(requested="torch", used="torch", notes=notes, extra=extra)
