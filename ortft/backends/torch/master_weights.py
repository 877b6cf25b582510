"""``precision.weights: bf16``: the training forward and backward run on a bf16 copy of the
model; the optimizer steps the model's own fp32 weights (the master weights).

Under bf16 autocast the weights stay fp32, so every linear's input and weight are cast each time
they are used, and the fp32 residual stream, norms and softmax cast back: a share of every bf16
step (docs/backends.md, "bf16 weights"). The copy holds its parameters in bf16, so activations,
norms and softmax run in bf16 too, and autocast only casts the fp32 inputs (pixels, features,
masks) as it meets them.

Everything but the training forward keeps reading the fp32 model: the optimizer and its state,
clipping, checkpoints (so resume is exact: the copy is the masters cast, before and after a
resume), evaluation, ``final/`` and the export. After each backward the copy's gradients are
added into the masters' in fp32 (several micro-batches accumulate there, not in bf16); after
each optimizer step the updated masters are cast back into the copy. The copy shares the
model's buffers (rotary frequencies stay fp32; a BatchNorm's running statistics are the model's
own) and its embedding tables (``Bf16Copy._share``), which train as under autocast.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

log = logging.getLogger("ortft")


def for_run(weights: str, dtype: str, route: str, model: nn.Module) -> Bf16Copy | None:
    """The copy where ``precision.weights`` is bf16 and the run trains bf16 on the torch route
    (a resolved auto may not: then the fp32 weights train, and stderr says so)."""
    if weights != "bf16":
        return None
    if dtype != "bf16" or route != "torch":
        log.info("precision.weights=bf16 unused: this run trains %s on %s", dtype, route)
        return None
    log.info("precision: a bf16 copy of the model trains; the optimizer steps fp32 weights")
    return Bf16Copy(model)


class Bf16Copy:
    """The bf16 copy of ``model`` and the pairing of its trainable parameters with the model's."""

    def __init__(self, model: nn.Module):
        self.copy = copy.deepcopy(model)
        shared = self._share(model)
        with torch.no_grad():
            for p in self.copy.parameters():  # tied weights: one Parameter, cast once
                if p.dtype == torch.float32 and id(p) not in shared:
                    p.data = p.data.to(torch.bfloat16)
        copied = dict(self.copy.named_parameters())
        pairs = [
            (p, copied[n])
            for n, p in model.named_parameters()
            if p.requires_grad and copied[n] is not p
        ]
        self.masters: list[torch.Tensor] = [m for m, _ in pairs]
        self.copies: list[torch.Tensor] = [c for _, c in pairs]

    def _share(self, model: nn.Module) -> set[int]:
        """The copy uses the model's own buffers, and its embedding tables, whose outputs are
        cast to bf16 as they leave: a lookup reads a few rows, so a bf16 table would only add
        two casts of the whole table a step (the gradient's and the update's), which on a
        30k-word vocabulary cost more than autocast's casts this saves. The ids of the model's
        parameters the copy now holds."""
        for name, buffer in model.named_buffers():
            owner, _, leaf = name.rpartition(".")
            self.copy.get_submodule(owner)._buffers[leaf] = buffer
        own: dict[int, torch.Tensor] = {}  # the copy's table (by id) -> the model's
        for name, module in self.copy.named_modules():
            if isinstance(module, nn.Embedding):
                table = model.get_submodule(name)
                assert isinstance(table, nn.Embedding)  # the copy's twin
                own[id(module.weight)] = table.weight
                module.register_forward_hook(_to_bf16)
        for module in self.copy.modules():  # every use, so a tied output layer shares it too
            for leaf, p in module._parameters.items():
                if p is not None and id(p) in own:
                    setattr(module, leaf, own[id(p)])  # a Parameter: registered as one
        return {id(p) for p in own.values()}

    def collect_grads(self) -> None:
        """After a backward: add the copy's gradients into the masters', in fp32."""
        for master, grad in self._grads():
            if master.grad is None:
                master.grad = grad.float()
            else:
                master.grad.add_(grad)

    def _grads(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Each master with its copy's gradient, which is taken from the copy."""
        for master, c in zip(self.masters, self.copies, strict=True):
            if c.grad is not None:  # a part the loss did not reach (an unused pooler): None
                yield master, c.grad
                c.grad = None

    @torch.no_grad()
    def update(self) -> None:
        """After an optimizer step: the updated masters, cast into the copy."""
        torch._foreach_copy_(self.copies, self.masters)


def _to_bf16(module: nn.Module, inputs: Any, output: torch.Tensor) -> torch.Tensor:
    return output.to(torch.bfloat16)
