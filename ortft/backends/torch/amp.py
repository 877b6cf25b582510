"""fp16 loss scaling: the optimizer step under a GradScaler, and the scaler's checkpoint state.

For fp32 and bf16 the scaler is disabled and every scaler call here is a no-op, so the same
step serves all three precisions. With fp16, a step whose gradients overflowed (inf/nan) is
skipped by the scaler: the weights stay, the scheduler does not advance, the loop counts it in
``summary.precision.skipped_steps`` (not an error: the scale halves and training goes on).

Clipping by the global norm (``training.max_grad_norm``) multiplies every gradient by the
clipping factor, one more pass over all of them each step. Where torch's fused AdamW steps and
no scaler runs, the factor is handed to the fused step instead (``fold_clip``), which divides
each gradient by it as it reads it: the same clipping, one pass fewer (the gradients themselves
are then left unclipped, and set to None right after).
"""

from __future__ import annotations

from typing import Any

import torch


def folds_clip(optimizer: Any, scaler: torch.amp.GradScaler) -> bool:
    """Whether the clipping factor can go to the optimizer's step (module docstring): torch's
    fused Adam/AdamW, which divides each gradient by its ``grad_scale`` attribute where one is
    set (the attribute a GradScaler sets), and no scaler of ours using that attribute."""
    return (
        not scaler.is_enabled()
        and bool(optimizer.defaults.get("fused"))
        and getattr(optimizer, "_step_supports_amp_scaling", False)
    )


def fold_clip(optimizer: Any, params: list[torch.nn.Parameter], max_norm: float) -> None:
    """``clip_grad_norm_(params, max_norm)``'s factor, as the divisor the fused step applies:
    the global norm over ``max_norm`` (with torch's 1e-6), at least 1 (no clipping below it)."""
    grads = [p.grad for p in params if p.grad is not None]
    norm = torch.nn.utils.get_total_norm(grads)
    optimizer.grad_scale = torch.clamp((norm + 1e-6) / max_norm, min=1.0)


def optimizer_step(
    optimizer: Any,
    scheduler: Any,
    scaler: torch.amp.GradScaler,
    params: list[torch.nn.Parameter],
    max_grad_norm: float | None,
) -> bool:
    """Clip, step, schedule, zero the gradients; False when fp16 loss scaling skipped the step."""
    scaler.unscale_(optimizer)  # fp16: clip the true gradients, not the scaled ones
    folded = False
    if max_grad_norm and folds_clip(optimizer, scaler):
        fold_clip(optimizer, params, max_grad_norm)
        folded = True
    elif max_grad_norm:
        torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    scale = scaler.get_scale()
    try:
        scaler.step(optimizer)  # fp16: skipped when a gradient overflowed (inf/nan)
    finally:
        if folded:
            del optimizer.grad_scale
    scaler.update()
    applied = scaler.get_scale() >= scale  # the scale shrinks only after a skipped step
    if applied:
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return applied


def scaler_state(scaler: torch.amp.GradScaler) -> dict[str, Any]:
    """What a checkpoint keeps of the scaler: the scale and the count of good steps since it
    last changed (``_growth_tracker``), plus the growth settings. Plain floats and ints, so
    ``torch.load(weights_only=True)`` reads it back; {} for a disabled scaler (fp32/bf16)."""
    return scaler.state_dict()


def load_scaler_state(scaler: torch.amp.GradScaler, state: dict[str, Any] | None) -> None:
    """Restore ``scaler_state``'s dict. A resumed fp16 run then starts at the scale it reached,
    not at 65536 again (which would skip its first steps while the scale comes back down).
    Nothing to do for a disabled scaler, or a checkpoint written without one (an fp32/bf16 run:
    the scaler starts fresh)."""
    if not state or not scaler.is_enabled():
        return
    scaler.load_state_dict(state)
