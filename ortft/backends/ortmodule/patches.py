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
"""

from __future__ import annotations

import importlib
from typing import Any

from torch import nn

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
    state_dict.setdefault(prefix + "bias", module.bias.detach().clone())


def add_layernorm_bias(module: nn.Module) -> int:
    """Give each bias-less affine LayerNorm a frozen zero bias; returns how many."""
    import torch

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
