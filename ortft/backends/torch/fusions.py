"""Module swaps that compute the same function in fewer kernels, for every route that runs
the model's Python forward (the torch backend eager, ORTModule's export).

GPT-2's ``NewGELUActivation`` writes the tanh GELU out as seven element-wise ops, each a kernel
forward and backward; ``gelu(approximate="tanh")`` is one. On the DPO peer bench (a 25M GPT-2,
torch bf16, 2 cores of an AMD EPYC Zen 4) the written-out GELU's tanh, pow, multiplies and adds
took about 15% of the step (torch.profiler; docs/preference.md).
"""

from __future__ import annotations

import torch
from torch import nn


class TanhGelu(nn.Module):
    """``gelu(x, approximate="tanh")``: the function HF's ``NewGELUActivation`` writes out as
    seven element-wise ops (GPT-2's ``gelu_new``), as one kernel."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(x, approximate="tanh")


def fuse_tanh_gelu(module: nn.Module) -> int:
    """Replace every ``NewGELUActivation`` in ``module`` by ``TanhGelu``; returns how many."""
    count = 0
    for parent in module.modules():
        for name, child in list(parent.named_children()):
            if type(child).__name__ == "NewGELUActivation":
                setattr(parent, name, TanhGelu())
                count += 1
    return count
