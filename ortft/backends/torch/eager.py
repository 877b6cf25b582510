"""Eager PyTorch: the baseline, with transformers' default (sdpa) attention.

Two bench-only variants are switched on by environment variables that ``ortft bench`` sets
for its worker processes (they are not recipe fields: a recipe describes a training run,
these describe a measurement):

- ``ORTFT_TORCH_ATTN=eager``: eager attention, the same model code ORTModule runs.
- ``ORTFT_TORCH_COMPILE=1``: ``torch.compile`` the module (inductor).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from ortft.backends.report import BackendReport

if TYPE_CHECKING:
    from torch import nn


class TorchBackend:
    name = "torch"

    def __init__(self) -> None:
        self.attn_implementation = os.environ.get("ORTFT_TORCH_ATTN", "sdpa")
        if self.attn_implementation not in ("sdpa", "eager"):
            raise ValueError(f"ORTFT_TORCH_ATTN={self.attn_implementation}: use sdpa or eager")
        self.compile = os.environ.get("ORTFT_TORCH_COMPILE", "0") == "1"

    def wrap(self, module: nn.Module, run_dir: Path) -> nn.Module:
        if self.compile:
            import torch

            if not hasattr(torch.compiler, "is_exporting"):
                # torch 2.6 lacks it; transformers 5.24's masking_utils calls it inside a
                # try/except that returns False in eager mode, but dynamo fails on the missing
                # attribute instead of taking the except (InternalTorchDynamoError). False is
                # what eager mode gets, so the compiled model masks as the eager one does.
                torch.compiler.is_exporting = lambda: False  # type: ignore[attr-defined]
            return torch.compile(module)  # type: ignore[return-value]
        return module

    def before_forward(self, seed: int, micro_step: int) -> None:
        return None  # torch's own RNG state is in every checkpoint

    def after_step(self, wrapped: nn.Module) -> None:
        return None

    def report(self) -> BackendReport:
        notes = []
        if self.attn_implementation != "sdpa":
            notes.append(f"attention={self.attn_implementation} (ORTFT_TORCH_ATTN)")
        if self.compile:
            notes.append("torch.compile (ORTFT_TORCH_COMPILE)")
        return BackendReport(requested="torch", used="torch", notes=notes)
