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
from typing import TYPE_CHECKING, Any

from ortft.run.summary import BackendReport

if TYPE_CHECKING:
    from torch import nn

# backend.* fields that configure ORTModule: set on another backend they would do nothing
ORTMODULE_FIELDS = (
    "allow_fallback", "log_level", "save_onnx", "memory_optimization_level",
    "compute_optimizer", "pytorch_kernels",
)  # fmt: skip


def ortmodule_fields_set(recipe: Any) -> list[str]:
    """The ORTModule-only backend fields this recipe sets to other than their defaults."""
    section = recipe.backend
    fields = type(section).model_fields
    return [f"backend.{k}" for k in ORTMODULE_FIELDS if getattr(section, k) != fields[k].default]


def recipe_problems(recipe: Any) -> list[str]:
    """What backend.name=torch refuses (torch-free: the recipe is validated before torch loads)."""
    problems = [
        f"{name} configures ORTModule (backend.name=ort or auto), not backend.name=torch"
        for name in ortmodule_fields_set(recipe)
    ]
    if recipe.optimizer.name == "adamw_ort_fused":
        problems.append("optimizer.name=adamw_ort_fused needs backend.name=ort")
    return problems


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
