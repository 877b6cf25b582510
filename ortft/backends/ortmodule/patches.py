"""Model fixes that let ORTModule train architectures it otherwise cannot (ORT-training 1.19.2,
torch 2.6, transformers 5.24, measured on CPU). Each is numerically identical to the model
it patches, is applied by ``OrtBackend.wrap`` only, and is a no-op on models that lack the
pattern; ``apply`` returns a note per fix for the run summary.

- DeBERTa (v1, v2/v3) with relative attention: ORT's ScaledSumFusion turns
  ``c2p / scale + p2c / scale (+ x)`` into com.microsoft ScaledSum, which has no CPU kernel
  (NOT_IMPLEMENTED) and whose 3-input form 1.19.2 mis-wires. The fusion matches only a scalar
  or 1-element 1-D divisor, so ``scaled_size_sqrt`` returns the same value shaped [1, 1, 1].
- Bias-less LayerNorm (ModernBERT's norm_bias=False): it exports as
  ``LayerNormalization(X, w, '')`` and ORT's gradient builder names the gradient of the
  missing bias ``_grad`` once per LayerNorm: "Duplicate definition of name (_grad)" with two
  or more. Each gets a frozen zero bias Parameter (a zero buffer is not enough: the exporter
  folds equal constants into one and the duplicate returns). A state_dict hook keeps the
  added ``*.bias`` keys out of checkpoints, best/ and final/, and a load hook fills them in,
  so the saved model is a plain one.
- Mixture-of-experts (Mixtral, ...): transformers' default experts kernel ``grouped_mm``
  calls torch.histc, which has no ONNX symbolic. ``batched_mm`` exports (tiny Mixtral on
  torch: the same loss to the bit as grouped_mm, gradients within 2.2e-8; the torch backend
  keeps grouped_mm); ``eager`` would bake the experts hit by the export's batch
  into the traced graph.

Vision models (each measured as ORT's losses against torch's, 3 AdamW steps, tiny configs):

- ``nn.AdaptiveAvgPool2d`` to 1x1: ORTModule's own symbolic sends every adaptive_avg_pool2d
  to an ATen node, and the gradients through a 1x1 one come back wrong where its output is
  broadcast back (squeeze-excitation: RegNet's SE layer, EfficientNet's): bias gradients of
  2.5e-3, 6.6e-7, 1.5e-10 for torch's 1.1e-2, 1.6e-2, 1.9e-2 (a regnet run's losses off by 1e-3).
  A 1x1 output becomes ONNX GlobalAveragePool, as torch's own exporter writes it; other
  sizes keep the ATen node (2x2 and 4x4 outputs measured right, to 2e-7).
- ``Conv(padding="same")``: it exports as ``auto_pad=SAME_UPPER``, which ORT's ConvGrad
  ignores (the weight gradient off by 52 on a scale of 50, EfficientNet's depthwise convs).
  Odd kernels get the same padding stated explicitly (symmetric, so the same convolution).
- ``nn.Hardswish`` / ``nn.Hardsigmoid`` (LeViT): ORT has no gradient builder for either
  (``The gradient builder has not been registered: HardSwish``); the same formula in
  elementary ops, ``x * clamp(x + 3, 0, 6) / 6``, exports as Add, Clip, Mul, Div.
- DINOv2's position embeddings and BEiT's relative position bias table are resized to the
  image's patch grid on every traced forward, even to the size they have (an identity that
  eager torch skips): DINOv2's bicubic Resize breaks ORT's symbolic shape inference ("Invalid
  item in shape: floor(pixel_values_dim2/8)"), BEiT's bilinear one needs ResizeGrad, which
  has no CPU kernel. Both skip it at the trained size, as eager torch does, so the graph is
  for that size (ortft's processor resizes every image to it).
"""

from __future__ import annotations

import importlib
import logging
import types
from typing import Any

import torch
from torch import nn

log = logging.getLogger("ortft")

DEBERTA_MODULES = (
    "transformers.models.deberta_v2.modeling_deberta_v2",
    "transformers.models.deberta.modeling_deberta",
)


def apply(module: nn.Module) -> list[str]:
    """Every fix ``module`` needs; the notes say which were applied."""
    notes = []
    if _patch_deberta(module):
        notes.append("patch: deberta scale shaped [1,1,1] (no ScaledSum fusion)")
    n = add_layernorm_bias(module)
    if n:
        notes.append(f"patch: frozen zero bias on {n} bias-less LayerNorm(s)")
    n = batched_experts(module)
    if n:
        notes.append("patch: experts_implementation=batched_mm (grouped_mm calls torch.histc)")
    notes.extend(vision_patches(module))
    return notes


def vision_patches(module: nn.Module) -> list[str]:
    """The vision fixes ``module`` needs (the module docstring), as notes."""
    notes = []
    if global_average_pool(module):
        notes.append("patch: 1x1 adaptive_avg_pool2d -> GlobalAveragePool (not ATen)")
    n, left = explicit_same_padding(module)
    if n:
        notes.append(f"patch: explicit padding on {n} padding='same' conv(s)")
    if left:  # even kernels: torch pads them asymmetrically, which Conv's pads cannot mirror
        log.warning(
            "%d padding='same' conv(s) with an even kernel: ORT's gradients are wrong", left
        )
        notes.append(f"warning: {left} padding='same' conv(s) with an even kernel left as is")
    n = elementary_hardswish(module)
    if n:
        notes.append(f"patch: {n} Hardswish/Hardsigmoid -> clamp formula (no ORT gradient)")
    n = static_position_embeddings(module)
    if n:
        notes.append(f"patch: {n} position embedding(s)/bias table(s) not resized at their size")
    return notes


def _model_types(module: nn.Module) -> set[str]:
    return {
        getattr(m.config, "model_type", "")
        for m in module.modules()
        if getattr(m, "config", None) is not None
    }


def _patch_deberta(module: nn.Module) -> bool:
    """Scoped to processes that wrap a DeBERTa model; idempotent (a marker on the function)."""
    if not _model_types(module) & {"deberta", "deberta-v2"}:
        return False
    for name in DEBERTA_MODULES:
        mod = importlib.import_module(name)
        original = getattr(mod, "scaled_size_sqrt", None)
        if original is None or getattr(original, "_ortft_patched", False):
            continue

        def scaled_size_sqrt(query_layer: Any, scale_factor: int, _orig: Any = original) -> Any:
            return _orig(query_layer, scale_factor).reshape(1, 1, 1)  # same value, no fusion

        scaled_size_sqrt._ortft_patched = True  # type: ignore[attr-defined]
        mod.scaled_size_sqrt = scaled_size_sqrt  # type: ignore[attr-defined]
    return True


def _drop_bias(module: nn.Module, state_dict: dict, prefix: str, _meta: Any) -> None:
    # A saved state dict (checkpoints, final/) holds detached tensors; the ONNX exporter reads
    # state_dict(keep_vars=True), whose Parameters must stay: dropped there, the bias is traced
    # as a constant and the duplicate gradient name returns (measured).
    if not isinstance(state_dict.get(prefix + "bias"), nn.Parameter):
        state_dict.pop(prefix + "bias", None)


def _fill_bias(module: nn.Module, state_dict: dict, prefix: str, *_args: Any) -> None:
    bias: Any = module.bias  # torch types a module attribute as Tensor | Module
    state_dict.setdefault(prefix + "bias", bias.detach().clone())


def add_layernorm_bias(module: nn.Module) -> int:
    """Give each bias-less affine LayerNorm a frozen zero bias; returns how many."""
    n = 0
    for ln in module.modules():
        if not (isinstance(ln, nn.LayerNorm) and ln.elementwise_affine and ln.bias is None):
            continue
        del ln._parameters["bias"]
        ln.bias = nn.Parameter(torch.zeros_like(ln.weight), requires_grad=False)
        ln._register_state_dict_hook(_drop_bias)
        ln._register_load_state_dict_pre_hook(_fill_bias, with_module=True)
        n += 1
    return n


def batched_experts(module: nn.Module) -> int:
    """Experts modules (transformers' ``@use_experts_implementation``: they read
    ``config._experts_implementation`` on every forward) running ``grouped_mm`` switch to
    ``batched_mm``; returns how many configs changed."""
    n = 0
    for m in module.modules():
        config = getattr(m, "config", None)
        if config is None or not hasattr(m, "is_concatenated") or not hasattr(m, "has_gate"):
            continue
        if getattr(config, "_experts_implementation", None) in (None, "grouped_mm"):
            config._experts_implementation = "batched_mm"
            n += 1
    return n


# --------------------------------------------------------------------------- vision


def global_average_pool(module: nn.Module) -> bool:
    """Where ``module`` has an ``nn.AdaptiveAvgPool2d``, ORTModule's adaptive_avg_pool2d
    symbolic (registered by every ORTModule it builds, for the whole process) becomes one that
    writes a 1x1 output as GlobalAveragePool and hands any other to ORT's own (ATen). Other
    models keep the change: it is the right export for them too. Idempotent."""
    if not any(isinstance(m, nn.AdaptiveAvgPool2d) for m in module.modules()):
        return False
    from onnxruntime.training.ortmodule._custom_op_symbolic_registry import (
        CustomOpSymbolicRegistry,
    )

    key = "::adaptive_avg_pool2d"
    aten = CustomOpSymbolicRegistry._SYMBOLICS.get(key)
    if aten is None or getattr(aten, "_ortft_patched", False):
        return aten is not None

    def adaptive_avg_pool2d(g: Any, x: Any, output_size: Any, _aten: Any = aten) -> Any:
        from torch.onnx import symbolic_helper

        size = symbolic_helper._maybe_get_const(output_size, "is")
        if isinstance(size, list | tuple) and all(s == 1 for s in size):
            return g.op("GlobalAveragePool", x)
        return _aten(g, x, output_size)

    adaptive_avg_pool2d._ortft_patched = True  # type: ignore[attr-defined]
    CustomOpSymbolicRegistry._SYMBOLICS[key] = adaptive_avg_pool2d
    return True


def explicit_same_padding(module: nn.Module) -> tuple[int, int]:
    """Each ``padding="same"`` convolution with odd kernels (every ``dilation * (k - 1)``
    even) gets that padding as numbers; returns (changed, left: an even kernel)."""
    n = left = 0
    for conv in module.modules():
        if not (isinstance(conv, nn.modules.conv._ConvNd) and conv.padding == "same"):
            continue
        total = [d * (k - 1) for d, k in zip(conv.dilation, conv.kernel_size, strict=True)]
        if any(t % 2 for t in total):
            left += 1
            continue
        conv.padding = tuple(t // 2 for t in total)
        conv._reversed_padding_repeated_twice = [t // 2 for t in reversed(total) for _ in (0, 1)]
        n += 1
    return n, left


class ElementaryHardswish(nn.Module):
    """``x * clamp(x + 3, 0, 6) / 6``: torch's Hardswish kernel, in ops ORT can differentiate."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * (x + 3.0).clamp(0.0, 6.0) / 6.0


class ElementaryHardsigmoid(nn.Module):
    """``clamp(x + 3, 0, 6) / 6``: torch's Hardsigmoid kernel, in ops ORT can differentiate."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x + 3.0).clamp(0.0, 6.0) / 6.0


def elementary_hardswish(module: nn.Module) -> int:
    """Swap each ``nn.Hardswish`` / ``nn.Hardsigmoid`` child; returns how many."""
    swaps = {nn.Hardswish: ElementaryHardswish, nn.Hardsigmoid: ElementaryHardsigmoid}
    n = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if type(child) in swaps:
                setattr(parent, name, swaps[type(child)]())
                n += 1
    return n


def _dinov2_positions(self: Any, embeddings: torch.Tensor, height: int, width: int) -> Any:
    if embeddings.shape[1] == self.position_embeddings.shape[1] and height == width:
        return self.position_embeddings  # eager torch's own shortcut, now when traced too
    return type(self).interpolate_pos_encoding(self, embeddings, height, width)


def _beit_bias(
    self: Any, window_size: Any, interpolate_pos_encoding: bool = False, dim_size: Any = None
) -> Any:
    if tuple(window_size) != tuple(self.window_size) or interpolate_pos_encoding:
        return type(self).forward(self, window_size, interpolate_pos_encoding, dim_size)
    # the table resized to its own size is itself: index it, as the original then does
    index = self.generate_relative_position_index(tuple(window_size))
    area = window_size[0] * window_size[1] + 1
    bias = self.relative_position_bias_table[index.view(-1)]
    return bias.view(area, area, -1).permute(2, 0, 1).contiguous().unsqueeze(0)


# class name -> (method, its replacement on the instance)
STATIC_POSITIONS: dict[str, tuple[str, Any]] = {
    "Dinov2Embeddings": ("interpolate_pos_encoding", _dinov2_positions),
    "BeitRelativePositionBias": ("forward", _beit_bias),
}


def static_position_embeddings(module: nn.Module) -> int:
    """DINOv2's embeddings and BEiT's relative position bias skip the resize to their own
    size on the instance (the class, and the torch backend, are untouched); returns how many.
    The originals are called through the class, so a deep copy keeps its own parameters."""
    n = 0
    for m in module.modules():
        method, replacement = STATIC_POSITIONS.get(type(m).__name__, (None, None))
        if method is not None and replacement is not None and method not in m.__dict__:
            setattr(m, method, types.MethodType(replacement, m))
            n += 1
    return n
