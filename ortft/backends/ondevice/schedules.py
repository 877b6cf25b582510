"""Learning-rate schedules as plain functions: transformers' ``get_scheduler`` without PyTorch.

``lr_at(step, ...)`` is the learning rate optimizer step ``step`` (0-based) uses. With
transformers, the optimizer's first step runs at the lr the scheduler was built with (its
``LambdaLR`` evaluates the schedule at 0 on construction) and each ``scheduler.step()`` after
an optimizer step moves to the next value, so step ``k`` uses the value ``get_last_lr()``
returns after ``k`` calls of ``scheduler.step()``, which is ``lr * factor(k)``. Every value of
the recipe's ``training.scheduler`` is here, with ``get_scheduler``'s defaults for the
arguments a recipe cannot set (``tests/test_schedules.py`` compares them with transformers):

- ``linear``: up from 0 over the warm-up, then down to 0 at ``total_steps``.
- ``cosine``: warm-up, then half a cosine wave down to 0 (``num_cycles`` 0.5).
- ``cosine_with_restarts``: warm-up, then ``num_cycles`` 1 hard restart cycle, i.e. the same
  curve as ``cosine`` but 0 from ``total_steps`` on.
- ``polynomial``: warm-up, then from ``lr`` down to ``lr_end`` 1e-7 with ``power`` 1.0 (linear);
  transformers refuses ``lr <= 1e-7``, and so does this.
- ``constant``: ``lr`` throughout; no warm-up, whatever ``warmup_steps`` says.
- ``constant_with_warmup``: warm-up, then ``lr``.
- ``inverse_sqrt``: warm-up, then ``lr / sqrt((step + shift) / timescale)`` with ``timescale``
  the warm-up steps (10 000 without warm-up) and ``shift = timescale - warmup_steps``.

Torch-free: the on-device loop (``backend.name: ort-ondevice``) sets the lr of each step itself.
"""

from __future__ import annotations

import math
from collections.abc import Callable

POLYNOMIAL_LR_END = 1e-7  # get_polynomial_decay_schedule_with_warmup's default
POLYNOMIAL_POWER = 1.0
INVERSE_SQRT_TIMESCALE = 10_000  # get_inverse_sqrt_schedule's timescale without warm-up


def resolve_warmup(steps: int, ratio: float, total_steps: int) -> int:
    """The recipe's warm-up in steps: ``training.warmup_steps``, else ``training.warmup_ratio``
    of all steps (rounded down, as the PyTorch loop does)."""
    return steps or int(ratio * total_steps)


def _warming(step: int, warmup: int) -> float:
    return float(step) / float(max(1, warmup))


def _decay_progress(step: int, warmup: int, total: int) -> float:
    return float(step - warmup) / float(max(1, total - warmup))


def _linear(step: int, warmup: int, total: int, lr: float) -> float:
    return max(0.0, float(total - step) / float(max(1, total - warmup)))


def _cosine(step: int, warmup: int, total: int, lr: float) -> float:
    progress = _decay_progress(step, warmup, total)
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * 0.5 * 2.0 * progress)))  # num_cycles 0.5


def _cosine_with_restarts(step: int, warmup: int, total: int, lr: float) -> float:
    progress = _decay_progress(step, warmup, total)
    if progress >= 1.0:
        return 0.0
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * ((1.0 * progress) % 1.0))))  # num_cycles 1


def _polynomial(step: int, warmup: int, total: int, lr: float) -> float:
    if step > total:
        return POLYNOMIAL_LR_END / lr
    pct_remaining = 1 - (step - warmup) / (total - warmup)
    decay = (lr - POLYNOMIAL_LR_END) * pct_remaining**POLYNOMIAL_POWER + POLYNOMIAL_LR_END
    return decay / lr


def _constant(step: int, warmup: int, total: int, lr: float) -> float:
    return 1.0


def _inverse_sqrt(step: int, warmup: int, total: int, lr: float) -> float:
    timescale = warmup or INVERSE_SQRT_TIMESCALE
    return 1.0 / math.sqrt((step + timescale - warmup) / timescale)


# the factor after the warm-up, by schedule name; the warm-up (step < warmup) is linear from 0
_AFTER_WARMUP: dict[str, Callable[[int, int, int, float], float]] = {
    "linear": _linear,
    "cosine": _cosine,
    "cosine_with_restarts": _cosine_with_restarts,
    "polynomial": _polynomial,
    "constant": _constant,
    "constant_with_warmup": _constant,
    "inverse_sqrt": _inverse_sqrt,
}
SCHEDULES = tuple(_AFTER_WARMUP)


def lr_at(step: int, *, schedule: str, lr: float, warmup_steps: int, total_steps: int) -> float:
    """The learning rate of optimizer step ``step`` (0-based; see the module docstring)."""
    after = _AFTER_WARMUP.get(schedule)
    if after is None:
        raise ValueError(f"unknown schedule {schedule!r}: choose one of {', '.join(SCHEDULES)}")
    if schedule == "polynomial" and not lr > POLYNOMIAL_LR_END:
        raise ValueError(f"lr_end ({POLYNOMIAL_LR_END}) must be smaller than initial lr ({lr})")
    warmup = 0 if schedule == "constant" else warmup_steps
    factor = _warming(step, warmup) if step < warmup else after(step, warmup, total_steps, lr)
    return lr * factor  # as LambdaLR: the initial lr times the schedule's factor
