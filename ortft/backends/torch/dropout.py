"""``backend.dropout_masks``: dropout's keep-masks from 16-bit random integers on a CPU.

torch 2.6's CPU ``bernoulli_`` (what ``F.dropout`` draws its mask with) runs MKL's vectorised
generator; later open-source builds turn that path off (pytorch#132395: its reseeding repeated
variates) and draw one Mersenne-Twister number per element. On torch 2.13 dropout's masks then
took 16-20% of a small encoder's bf16 training step, against 4% on 2.6 (docs/backends.md).

Here each element takes 16 random bits, four to a 64-bit word, and is kept where its integer is
at or above the threshold: a keep-probability of ``1 - p`` rounded to a multiple of 2^-16 (at
most 7.6e-6 off), with the kept values scaled by the inverse of that rounded probability, so
the expectation is the input's, as torch's dropout keeps it. The words come from numpy's SFC64
generator (twice the rate of torch's serial 64-bit ``random_`` on a CPU), seeded for each call
by one draw of torch's default CPU generator, which every checkpoint saves: a resumed run draws
the masks the uninterrupted one did. The comparison writes the mask as ones and zeros in the
input's dtype (the memory torch's CPU dropout keeps for its noise), and forward and backward
are each one ``addcmul``: the product with the mask and the scale in one pass, the scale
applied in float before the result is rounded (a bf16 mask holding the scale would round
1/0.9 to 1.109).

``Masks`` is a ``TorchFunctionMode`` around the training forward (``Forward``), so it reaches
``nn.Dropout`` modules and the functional dropout a model's attention calls alike; every other
call passes through. It intercepts ``torch.nn.functional.dropout`` only, on CPU tensors, in
training, for 0 < p < 1, out of place (an in-place call stays torch's).
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.overrides import TorchFunctionMode

LEVELS = 1 << 16  # the values a 16-bit integer takes
# the first torch whose CPU bernoulli_ is taken to draw one number per element: 2.6.0 draws with
# MKL and 2.13.0 does not (both measured, docs/backends.md); the releases between are not
SLOW_BERNOULLI_FROM = (2, 7)
_DROPOUT_ARGS = inspect.signature(torch.nn.functional.dropout)


def kept_levels(p: float) -> int:
    """How many of the 2^16 integer values keep an element: ``(1 - p) * 2^16``, rounded."""
    return round((1.0 - p) * LEVELS)


def random_words(n: int) -> torch.Tensor:
    """``n`` uniform 64-bit integers from SFC64, seeded by one draw of torch's generator."""
    seed = int(torch.empty((), dtype=torch.int64).random_())
    return torch.from_numpy(np.random.SFC64(seed).random_raw(n).view(np.int64))


def keep_mask(shape: torch.Size, p: float, dtype: torch.dtype = torch.bool) -> torch.Tensor:
    """``shape`` elements of ``dtype``, each 1 (kept) with probability ``kept_levels(p) / 2^16``
    and 0 otherwise."""
    n = shape.numel()
    lanes = random_words((n + 3) // 4).view(torch.int16)[:n].view(shape)
    # int16 runs from -2^15 to 2^15 - 1; the comparison writes the dtype itself (no cast pass)
    return torch.ge(lanes, LEVELS // 2 - kept_levels(p), out=torch.empty(shape, dtype=dtype))


def scaled_product(a: torch.Tensor, keep: torch.Tensor, scale: float) -> torch.Tensor:
    """``a * keep * scale`` in one pass, the scale applied before rounding to ``a``'s dtype."""
    return torch.addcmul(torch.zeros((), dtype=a.dtype), a, keep, value=scale)


class _Dropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, p: float) -> torch.Tensor:
        keep = keep_mask(x.shape, p, x.dtype)
        ctx.save_for_backward(keep)
        ctx.scale = LEVELS / kept_levels(p)
        return scaled_product(x, keep, ctx.scale)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (keep,) = ctx.saved_tensors
        return scaled_product(grad, keep, ctx.scale), None


def dropout(x: torch.Tensor, p: float) -> torch.Tensor:
    """Training-mode dropout of ``x`` with masks from ``keep_mask`` (0 < p < 1)."""
    return _Dropout.apply(x, p)


def applies(x: Any, p: float, training: bool) -> bool:
    """Whether ``Masks`` takes this dropout call: a CPU tensor, training, and a probability the
    16-bit threshold keeps strictly between none and all."""
    return (
        training
        and isinstance(x, torch.Tensor)
        and x.device.type == "cpu"
        and x.is_floating_point()
        and 0 < kept_levels(p) < LEVELS
    )


class Masks(TorchFunctionMode):
    """Routes ``F.dropout`` calls that ``applies`` takes to ``dropout``; counts them."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.nn.functional.dropout:
            bound = _DROPOUT_ARGS.bind(*args, **kwargs)
            bound.apply_defaults()
            args_of = bound.arguments
            x, p, training = args_of["input"], args_of["p"], args_of["training"]
            # an in-place call may be relied on for its side effect: torch's keeps it
            if not args_of["inplace"] and applies(x, float(p), bool(training)):
                self.calls += 1
                return dropout(x, float(p))
        return func(*args, **kwargs)


class Forward:
    """The training forward with ``Masks`` around it (the backward runs outside: it needs no
    interception, the autograd function holds its mask)."""

    def __init__(self, forward: Any, masks: Masks) -> None:
        self.forward = forward
        self.masks = masks

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self.masks:
            return self.forward(*args, **kwargs)


def torch_version() -> Any:
    """torch's own ``TorchVersion``: it compares with a tuple such as ``SLOW_BERNOULLI_FROM``."""
    return torch.__version__


def drops(model: nn.Module) -> bool:
    """Whether any dropout in ``model`` drops: an ``nn.Dropout`` with p > 0, or the float
    ``attention_dropout`` that decoders' attention passes to ``F.dropout``."""
    for m in model.modules():
        if isinstance(m, nn.Dropout) and m.p > 0:
            return True
        rate = getattr(m, "attention_dropout", None)
        if isinstance(rate, float) and rate > 0:
            return True
    return False


def recomputes(model: nn.Module) -> bool:
    """Gradient checkpointing: its backward reruns the forward, outside ``Masks``."""
    return any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules())


def plan(setting: str, compiled: bool, device: str, model: nn.Module) -> tuple[bool, str]:
    """Whether the run draws its masks here, and why (the report's note)."""
    if setting == "torch":
        return False, "torch's dropout (backend.dropout_masks=torch)"
    if compiled:  # a compiled forward draws its own masks (inductor's random kernels)
        return False, "torch's dropout (a compiled forward: inductor draws the masks)"
    if recomputes(model):  # the recompute would draw torch's masks, not the forward's
        return False, "torch's dropout (gradient checkpointing recomputes the forward)"
    if not drops(model):
        return False, "no dropout in the model"
    if device != "cpu":  # a GPU's generator draws in parallel
        return False, "torch's dropout (not a CPU)"
    if setting == "int16":
        return True, "16-bit masks (backend.dropout_masks=int16)"
    if torch_version() < SLOW_BERNOULLI_FROM:
        return False, f"torch's dropout (auto: torch {torch.__version__} draws with MKL)"
    return True, f"16-bit masks (auto: torch {torch.__version__}'s CPU bernoulli_ is serial)"
