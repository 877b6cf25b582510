"""Eager PyTorch: the baseline, with transformers' default (sdpa) attention."""

from __future__ import annotations

from pathlib import Path

from torch import nn

from ortft.backends import BackendReport


class TorchBackend:
    name = "torch"
    attn_implementation = "sdpa"

    def wrap(self, module: nn.Module, run_dir: Path) -> nn.Module:
        return module

    def after_step(self, wrapped: nn.Module) -> None:
        return None

    def report(self) -> BackendReport:
        return BackendReport(requested="torch", used="torch")
