"""PyTorch: the baseline, eager or compiled, with the attention kernels that train fastest on
the device and precision at hand (``attention``).

``backend.compile: true`` (or the ``auto`` probe's choice) runs the forward through
``torch.compile`` (``compiled.py``): the engine puts ``outer`` around its forward, outside DDP.
Eager, ``backend.unpad`` runs the encoder's per-position layers on the real tokens only
(``unpad.py``), and ``backend.dropout_masks`` draws dropout's masks 16 bits at a time on a CPU
(``dropout.py``); where it does, an fp32 model built with sdpa switches to eager attention.

A bench-only variant is switched on by an environment variable that ``ortft bench`` sets for
its worker processes (not a recipe field: a recipe describes a training run, this describes a
measurement): ``ORTFT_TORCH_ATTN=eager`` (or ``sdpa``) fixes the attention, whatever
``attention`` would choose; ``eager`` is the same model code ORTModule runs.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ortft.backends.report import BackendReport

if TYPE_CHECKING:
    import torch
    from torch import nn

log = logging.getLogger("ortft")

# Why bf16 on CPU trains with eager attention, not transformers' default sdpa (torch 2.6, 2 cores
# of an Intel Xeon with AMX, MiniLM batch 16, bf16 autocast, fused AdamW, ms per step over 3
# alternating runs with the model's attention dropout 0.1, 2 without):
#   length 64:  sdpa 264-266, eager 239-248 with dropout (sdpa takes its math path);
#               384-437 against 229-272 without (sdpa's CPU flash kernel: its backward takes
#               twice eager's)
#   length 128: sdpa 503-510, eager 416-432 with dropout; 698-731 against 392-396 without.
# In fp32 they are within 7% (453 / 457 ms at 64, 910 / 852 at 128, one run each), so fp32 keeps
# sdpa, as does CUDA (not measured). An AMD EPYC (Zen 4: AVX-512 BF16, no AMX) trains the ViT,
# Whisper and MiniLM bench models faster with eager in bf16 too (docs/backends.md).
# Reproduce: make bench-attention (benchmarks/attention_cpu.py).
EAGER_ON_CPU_BF16 = "eager attention: sdpa's CPU bf16 kernels train 1.1-1.9x slower (measured)"
# In fp32 the dropout decides: sdpa draws its attention dropout inside the kernel with torch's
# bernoulli_ (serial on torch >= 2.7), where eager attention calls F.dropout, which the backend's
# 16-bit masks replace (dropout.py). So where the masks are drawn, fp32 switches to eager too
# (docs/backends.md; python benchmarks/dropout_masks.py --attention).
EAGER_WITH_OWN_MASKS = "eager attention: its dropout takes the 16-bit masks, sdpa's does not"


def attention(device: torch.device, dtype: str) -> tuple[str, str | None]:
    """The attention a torch-route model is built with, and why when it is not the default."""
    forced = os.environ.get("ORTFT_TORCH_ATTN") or None  # set but empty: unset
    if forced is not None:
        if forced not in ("sdpa", "eager"):
            from ortft.core.errors import InputError

            raise InputError(f"ORTFT_TORCH_ATTN={forced}: use sdpa or eager")
        return forced, f"attention={forced} (ORTFT_TORCH_ATTN)"
    if device.type == "cpu" and dtype == "bf16":
        return "eager", EAGER_ON_CPU_BF16
    return "sdpa", None


class TorchBackend:
    name = "torch"

    def __init__(
        self,
        compile: bool = False,
        unpad: Any = False,
        dropout_masks: str = "torch",
        compile_key: str | None = None,
    ) -> None:
        self.attention: str | None = None  # the model's (attn_implementation, _eager_for_masks)
        self.attention_note: str | None = None  # why the model's attention is not sdpa
        self.compile = compile
        self.clock: Any = None  # compiled: the first step's time (compiled.CompileClock)
        self.compile_key = compile_key  # what the clock remembers it under (None: nothing)
        self.unpad_setting = unpad  # backend.unpad: true, false or auto
        self.unpadder: Any = None  # unpad.Unpadder, where the run unpads
        self.unpad_reason: str | None = None
        self.masks_setting = dropout_masks  # backend.dropout_masks: auto, torch or int16
        self.masks: Any = None  # dropout.Masks, where the run draws its own
        self.masks_applied = False  # outer put them around the forward (not DeepSpeed's)
        self.model: Any = None  # the TaskModule's model (wrap), whose attention outer may switch
        self.masks_reason: str | None = None

    def attn_implementation(self, device: torch.device, dtype: str) -> str:
        """The attention the model is built with (``attention``), noted for the report."""
        self.attention, self.attention_note = attention(device, dtype)
        return self.attention

    def wrap(self, module: nn.Module, run_dir: Path) -> nn.Module:
        """The module itself (evaluation, saving and export use it), its encoder unpadded where
        ``unpad.plan`` says so."""
        from ortft.backends.torch import fusions, unpad

        swapped = fusions.fuse_tanh_gelu(module)  # the same function in one kernel
        if swapped:
            log.info("backend: GPT-2's written-out GELU as gelu(approximate=tanh) x%d", swapped)
        model, task = getattr(module, "model", None), getattr(module, "task", None)
        if model is None or task is None:  # not a TaskModule: nothing to plan
            return module
        device = next(module.parameters()).device.type
        on, self.unpad_reason = unpad.plan(model, task, self.unpad_setting, self.compile, device)
        if on:
            self.unpadder = unpad.install(unpad.encoder_of(model))
        self._plan_masks(model, device)
        self.model = model  # outer switches its attention where it applies the masks
        return module

    def _plan_masks(self, model: nn.Module, device: str) -> None:
        from ortft.backends.torch import dropout

        on, self.masks_reason = dropout.plan(self.masks_setting, self.compile, device, model)
        self.masks = dropout.Masks() if on else None

    def _eager_for_masks(self, model: nn.Module) -> None:
        """Switch a model built with sdpa (fp32 on a CPU) to eager attention, whose dropout the
        masks draw (``EAGER_WITH_OWN_MASKS``); a model that cannot switch keeps sdpa."""
        switch = getattr(model, "set_attn_implementation", None)
        if switch is None:
            return
        switch("eager")
        if getattr(model.config, "_attn_implementation", None) == "eager":
            self.attention, self.attention_note = "eager", EAGER_WITH_OWN_MASKS

    def outer(self, forward: nn.Module) -> Any:
        """The training forward: compiled around DDP (or the module) when compile is on, inside
        ``dropout.Masks`` where the run draws its own dropout masks (the model's sdpa attention
        then turned eager: ``_eager_for_masks``). DeepSpeed's engine runs its own forward and
        never calls this, so its runs keep torch's dropout and their attention."""
        if self.masks is not None:
            from ortft.backends.torch import dropout

            self.masks_applied = True
            if self.attention == "sdpa" and self.attention_note is None:
                self._eager_for_masks(self.model)
            return dropout.Forward(forward, self.masks)
        if not self.compile:
            return forward
        from ortft.backends.torch import compiled

        self.clock = compiled.CompileClock(self.compile_key)
        return compiled.compile_forward(forward)

    def before_forward(self, seed: int, micro_step: int) -> None:
        if self.clock is not None:
            self.clock.start()  # torch's own RNG state is in every checkpoint

    def after_step(self, wrapped: nn.Module) -> None:
        if self.clock is not None:
            self.clock.stop()

    def report(self) -> BackendReport:
        notes, extra = [], {}
        if self.attention_note is not None:
            notes.append(self.attention_note)
        if self.unpadder is not None:
            notes.append(f"unpad: {self.unpad_reason}")
        extra["unpad"] = {
            "on": self.unpadder is not None,
            "why": self.unpad_reason,
            "gathered_forwards": self.unpadder.calls if self.unpadder is not None else 0,
        }
        why = self.masks_reason
        if self.masks is not None and not self.masks_applied:
            why = "torch's dropout (the forward is not this backend's: DeepSpeed)"
        extra["dropout_masks"] = {
            "own": self.masks_applied,
            "why": why,
            "calls": self.masks.calls if self.masks_applied else 0,
        }
        if self.masks_applied:
            notes.append(f"dropout: {self.masks_reason}")
        if self.compile:
            extra["compile"] = self.clock.record() if self.clock is not None else {}
            notes.append(f"torch.compile ({extra['compile'].get('compiler')}, dynamic shapes)")
        return BackendReport(requested="torch", used="torch", notes=notes, extra=extra)
