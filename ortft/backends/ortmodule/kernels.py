"""PyTorch kernels inside ORTModule's graph, for the ops whose ONNX Runtime CPU kernels are slow.

Measured on 2 CPU cores (ORT 1.19.2, torch 2.6, ``benchmarks/README.md``): ORT's CPU training
kernels for a few element-wise and normalisation ops run single-threaded and unvectorised, and
they cost more than the matrix multiplications around them:

- GELU's gradient (``BiasGeluGrad_dX``, ``FastGeluGrad``): 14 ms and 27 ms per call on a
  16 x 128 x 1024 / 8 x 128 x 1024 activation, where PyTorch's ``gelu_backward`` takes 5 ms;
- ``LayerNormalizationGrad``: 2.4 ms per call against PyTorch's 0.4 ms;
- ``SoftmaxCrossEntropyLossInternal`` (+ its gradient) over a 1024 x 4000 vocabulary: 48 ms;
- ``Dropout`` (+ its gradient): MiniLM (6 layers, batch 16 x 128) with its dropout 0.1 took 630
  ms a step against 489 with dropout off (``ortft bench``, 2 repeats); torch pays nothing for it.
- ``Conv`` and ``ConvGrad`` (MLAS im2col + GEMM): on benchmarks/peer_diffusion.py's UNet (64/128
  channels, 16x16 latents, batch 32; ORT's session profiler, a quiet machine) 33 convolutions
  took 196 ms a step forward and 446 ms backward, PyTorch's oneDNN kernels 99 and 226 (torch's
  profiler); routed (``conv.py``), 96 and 207, and a whole UNet step (forward, backward, clip,
  AdamW) went from 835 to 625 ms (one process, alternating; eager PyTorch 589).
- ``GatherGrad`` (the gradient of the row gathers ``backend.unpad`` traces into the graph):
  29% of an unpadded MiniLM step's kernel time on the long-text peer bench; routed
  (``rows.py``), PyTorch's ``index_add``.

ORTModule can already run single PyTorch ops as ``org.pytorch.aten::ATen`` nodes of its graph
(its embedding is one): ONNX Runtime plans and runs the graph, and calls the PyTorch kernel
through DLPack for that node, without copies. Here the ops above are exported that way, with
their gradients defined as ATen nodes too. Ops whose arguments the ATen executor cannot pass
(a string, a ``bool[3]`` mask) go through three small ``ortft::`` operators defined with
``torch.library`` that call the PyTorch kernels. GPT-2's ``NewGELUActivation`` (the tanh formula
written out in Python) becomes ``gelu(approximate="tanh")``: the same function, one kernel.

An op is routed only when its gradient node can be built: LayerNorm when its weight and bias
train and nothing in the model is frozen (``backend.trainable``), cross-entropy with mean
reduction and no class weights or label smoothing, dropout in training mode with p > 0 (its
masks come from a generator of its own, reseeded every micro-step like ORT's, so a resumed run
draws the masks the uninterrupted one drew), a 2-D convolution when its weight and bias train
and its input needs a gradient (``conv.py``). Everything else keeps ORTModule's own export.
``routed()`` counts the routed nodes of an exported graph; the run summary reports them under
``backend.pytorch_kernels``.
"""

from __future__ import annotations

from typing import Any, get_args

import torch
from torch import nn

from ortft.backends.ortmodule import conv, rows
from ortft.recipe.backends import PytorchKernel

KERNELS: tuple[str, ...] = get_args(PytorchKernel)  # the recipe's names, in its order
ATEN = "org.pytorch.aten::ATen"

_STATE: dict[str, Any] = {
    "library": None,
    "originals": None,
    "all_trainable": True,
    "generator": None,  # dropout's masks (``reseed``)
}
# ATen operator -> the kernel it stands for (what ``routed`` counts in an exported graph)
OPERATORS = {
    "gelu": "gelu",
    "ortft::gelu_tanh": "gelu",
    "ortft::layer_norm": "layer_norm",
    "ortft::cross_entropy": "cross_entropy",
    "ortft::dropout": "dropout",
    **{op: "conv" for op in conv.OPERATORS},
    **{op: "index_select" for op in rows.OPERATORS},
}


def resolve(setting: str | list[str], device_type: str) -> tuple[str, ...]:
    """``backend.pytorch_kernels`` -> the kernels to route: ``auto`` is all of them on CPU and
    none on CUDA (ORT's CUDA kernels for these ops are fused and fast)."""
    if setting == "auto":
        return KERNELS if device_type == "cpu" else ()
    return tuple(k for k in KERNELS if k in setting)


def routed(model: Any) -> dict[str, int]:
    """The nodes of an exported ORTModule graph (``onnx.ModelProto``) that run PyTorch
    kernels routed here, per kernel."""
    counts: dict[str, int] = {}
    for node in model.graph.node:
        if node.op_type != "ATen":
            continue
        operator = next((a.s.decode() for a in node.attribute if a.name == "operator"), "")
        kernel = OPERATORS.get(operator)
        if kernel:
            counts[kernel] = counts.get(kernel, 0) + 1
    return counts


def _define_library() -> None:
    """The ``ortft::`` operators (once per process): PyTorch kernels behind signatures the ATen
    executor can call (tensors, ints and floats only)."""
    if _STATE["library"] is not None:
        return
    lib = torch.library.Library("ortft", "DEF")
    key = "CompositeExplicitAutograd"
    lib.define("gelu_tanh(Tensor x) -> Tensor")
    lib.impl("gelu_tanh", lambda x: torch.nn.functional.gelu(x, approximate="tanh"), key)
    lib.define("gelu_tanh_backward(Tensor grad, Tensor x) -> Tensor")
    lib.impl(
        "gelu_tanh_backward",
        lambda grad, x: torch.ops.aten.gelu_backward(grad, x, approximate="tanh"),
        key,
    )
    lib.define(
        "layer_norm(Tensor x, Tensor weight, Tensor bias, float eps) -> (Tensor, Tensor, Tensor)"
    )
    lib.impl(
        "layer_norm",
        lambda x, w, b, eps: torch.ops.aten.native_layer_norm(x, [x.shape[-1]], w, b, eps),
        key,
    )
    lib.define(
        "layer_norm_backward(Tensor grad, Tensor x, Tensor mean, Tensor rstd, Tensor weight, "
        "Tensor bias) -> (Tensor, Tensor, Tensor)"
    )
    lib.impl(
        "layer_norm_backward",
        lambda grad, x, mean, rstd, w, b: torch.ops.aten.native_layer_norm_backward(
            grad, x, [x.shape[-1]], mean, rstd, w, b, [True, True, True]
        ),
        key,
    )
    lib.define("cross_entropy(Tensor logits, Tensor target, int ignore_index) -> (Tensor, Tensor)")
    lib.impl("cross_entropy", _cross_entropy, key)
    lib.define(
        "cross_entropy_backward(Tensor grad, Tensor log_probs, Tensor target, int ignore_index) "
        "-> Tensor"
    )
    lib.impl("cross_entropy_backward", _cross_entropy_backward, key)
    lib.define("dropout(Tensor x, float p) -> (Tensor, Tensor)")
    lib.impl("dropout", _dropout_kernel, key)
    lib.define("dropout_backward(Tensor grad, Tensor mask) -> Tensor")
    lib.impl("dropout_backward", lambda grad, mask: grad * mask, key)
    conv.define(lib, key)
    rows.define(lib, key)
    _STATE["library"] = lib


def reseed(seed: int, micro_step: int) -> None:
    """Dropout's generator for micro-batch ``micro_step``: the masks are a function of where
    the run is (see ``ort_rng``, which does the same for ORT's own generator)."""
    from ortft.backends.ortmodule import rng as ort_rng

    if _STATE["generator"] is None:
        _STATE["generator"] = torch.Generator()
    _STATE["generator"].manual_seed(ort_rng.stream_seed(seed, micro_step))


def _dropout_kernel(x: torch.Tensor, p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(x * mask, mask), the mask holding 0 or 1 / (1 - p), each element kept with probability
    1 - p. A float mask costs 4 bytes an element (ORT's is a bitmask) but is the fastest way:
    on a 16x12x128x128 tensor, 2 threads, 2.6 ms against 5.9 for aten's native_dropout (global
    generator) and 9-13 for a uint8 mask."""
    if _STATE["generator"] is None:
        reseed(0, 0)
    mask = torch.empty_like(x).bernoulli_(1.0 - p, generator=_STATE["generator"])
    mask.mul_(1.0 / (1.0 - p))
    return x * mask, mask


def _cross_entropy(
    logits: torch.Tensor, target: torch.Tensor, ignore_index: int
) -> tuple[torch.Tensor, torch.Tensor]:
    log_probs = torch.log_softmax(logits, 1)
    loss = torch.nn.functional.nll_loss(log_probs, target, ignore_index=ignore_index)
    return loss, log_probs


def _cross_entropy_backward(
    grad: torch.Tensor, log_probs: torch.Tensor, target: torch.Tensor, ignore_index: int
) -> torch.Tensor:
    total = (target != ignore_index).sum().to(log_probs.dtype)  # mean over the counted rows
    d_log_probs = torch.ops.aten.nll_loss_backward(
        grad, log_probs, target, None, 1, ignore_index, total
    )
    return torch.ops.aten._log_softmax_backward_data(d_log_probs, log_probs, 1, log_probs.dtype)


# ---- export (torch.onnx symbolics) -------------------------------------------------------------


def _none(g: Any) -> Any:
    """An absent optional input (exported as ''): the ATen executor then uses the default."""
    value = g.op("prim::Constant")
    value.setType(torch._C.NoneType.get())
    return value


def _const(value: Any) -> Any:
    from torch.onnx import symbolic_helper

    try:
        return symbolic_helper._maybe_get_const(value, "s")
    except Exception:  # noqa: BLE001 - not a constant string: keep ORTModule's export
        return None


def _gelu(g: Any, self: Any, approximate: Any = "none") -> Any:
    mode = approximate if isinstance(approximate, str) else _const(approximate)
    if mode == "tanh":
        out = g.op(ATEN, self, operator_s="ortft::gelu_tanh")
    elif mode == "none":
        out = g.op(ATEN, self, _none(g), operator_s="gelu")
    else:
        from torch.onnx import symbolic_opset9

        return symbolic_opset9.gelu(g, self, approximate)
    out.setType(self.type())
    return out


def _layer_norm(
    g: Any, input: Any, normalized_shape: Any, weight: Any, bias: Any, eps: Any, cudnn: Any
) -> Any:
    from torch.onnx import symbolic_helper

    original = _STATE["originals"]["::layer_norm"]
    shape = symbolic_helper._maybe_get_const(normalized_shape, "is")
    affine = not (symbolic_helper._is_none(weight) or symbolic_helper._is_none(bias))
    # The gradient node must produce the gradients of input, weight and bias, all three: ORT's
    # ATen kernel cannot leave an output out. Weight and bias are parameters, whose flags the
    # export keeps; an activation's flag it does not, so the input's gradient is known to be
    # needed only when every parameter of the model trains (nothing frozen upstream).
    trainable = affine and weight.requires_grad() and bias.requires_grad()
    if (
        not (trainable and _STATE["all_trainable"])
        or not isinstance(shape, list)
        or len(shape) != 1
    ):
        return original(g, input, normalized_shape, weight, bias, eps, cudnn)
    eps_value = g.op(
        "Constant",
        value_t=torch.tensor(symbolic_helper._maybe_get_const(eps, "f"), dtype=torch.float32),
    )
    out, _mean, _rstd = g.op(
        ATEN, input, weight, bias, eps_value, operator_s="ortft::layer_norm", outputs=3
    )
    out.setType(input.type())
    return out


def _cross_entropy_loss(
    g: Any,
    logits: Any,
    target: Any,
    weight: Any,
    reduction: Any,
    ignore_index: Any,
    label_smoothing: Any = None,
) -> Any:
    from torch.onnx import symbolic_helper

    original = _STATE["originals"]["::cross_entropy_loss"]
    mean = symbolic_helper._maybe_get_const(reduction, "i") == 1
    smoothing = (
        0.0
        if label_smoothing is None or symbolic_helper._is_none(label_smoothing)
        else symbolic_helper._maybe_get_const(label_smoothing, "f")
    )
    index = symbolic_helper._maybe_get_const(ignore_index, "i")
    if not (mean and symbolic_helper._is_none(weight) and smoothing == 0.0) or not isinstance(
        index, int
    ):
        return original(g, logits, target, weight, reduction, ignore_index, label_smoothing)
    index_value = g.op("Constant", value_t=torch.tensor(index, dtype=torch.int64))
    loss, _log_probs = g.op(
        ATEN, logits, target, index_value, operator_s="ortft::cross_entropy", outputs=2
    )
    loss.setType(logits.type().with_sizes([]))
    return loss


def _dropout(g: Any, input: Any, p: Any, train: Any) -> Any:
    """Training-mode dropout with p > 0 as ``ortft::dropout``; else torch.onnx's Dropout (at
    p = 0 or in eval it is the identity, which ORT runs for nothing)."""
    from torch.onnx import symbolic_helper, symbolic_opset12

    ratio = symbolic_helper._maybe_get_const(p, "f")
    training = symbolic_helper._maybe_get_const(train, "b")
    if not (isinstance(ratio, float) and ratio > 0.0 and training is True):
        return symbolic_opset12.dropout(g, input, p, train)  # torch.onnx's own: ONNX Dropout
    ratio_value = g.op("Constant", value_t=torch.tensor(ratio, dtype=torch.float32))
    out, _mask = g.op(ATEN, input, ratio_value, operator_s="ortft::dropout", outputs=2)
    out.setType(input.type())
    return out


def _convolution(g: Any, *args: Any) -> Any:
    return conv.symbolic(g, _STATE["originals"]["::_convolution"], *args)


def _index_select(g: Any, x: Any, dim: Any, index: Any) -> Any:
    from torch.onnx import symbolic_opset9

    original = _STATE["originals"]["::index_select"] or symbolic_opset9.index_select
    return rows.symbolic(g, original, x, dim, index)


# ---- gradients (ORT's gradient builder) --------------------------------------------------------


def _aten(inputs: list[str], outputs: list[str], operator: str) -> tuple[Any, ...]:
    return (
        ("ATen", "org.pytorch.aten"),
        inputs,
        outputs,
        {"operator": {"value": operator, "dtype": "string"}},
    )


GRADIENTS = {
    "gelu": [
        (("gelu", ""), [_aten(["GO(0)", "I(0)", "I(1)"], ["GI(0)"], "gelu_backward")]),
        (
            ("ortft::gelu_tanh", ""),
            [_aten(["GO(0)", "I(0)"], ["GI(0)"], "ortft::gelu_tanh_backward")],
        ),
    ],
    "layer_norm": [
        (
            ("ortft::layer_norm", ""),
            [
                _aten(
                    ["GO(0)", "I(0)", "O(1)", "O(2)", "I(1)", "I(2)"],
                    ["GI(0)", "GI(1)", "GI(2)"],
                    "ortft::layer_norm_backward",
                )
            ],
        )
    ],
    "cross_entropy": [
        (
            ("ortft::cross_entropy", ""),
            [_aten(["GO(0)", "O(1)", "I(1)", "I(2)"], ["GI(0)"], "ortft::cross_entropy_backward")],
        )
    ],
    "dropout": [
        (
            ("ortft::dropout", ""),
            [_aten(["GO(0)", "O(1)"], ["GI(0)"], "ortft::dropout_backward")],
        )
    ],
    "conv": [
        ((op, ""), [_aten(inputs, outputs, backward)])
        for op, inputs, outputs, backward in conv.GRADIENTS
    ],
    "index_select": [
        ((op, ""), [_aten(inputs, outputs, backward)])
        for op, inputs, outputs, backward in rows.GRADIENTS
    ],
}
SYMBOLICS = {
    "gelu": ("::gelu", _gelu),
    "layer_norm": ("::layer_norm", _layer_norm),
    "cross_entropy": ("::cross_entropy_loss", _cross_entropy_loss),
    "dropout": ("::dropout", _dropout),
    "conv": ("::_convolution", _convolution),
    "index_select": ("::index_select", _index_select),
}


def install(kernels: tuple[str, ...], module: nn.Module) -> None:
    """Route ``kernels`` through PyTorch (and only those) when ``module`` is wrapped in
    ORTModule: ORTModule registers symbolics and gradients when it is constructed, so call this
    just before."""
    from onnxruntime.training.ortmodule._custom_gradient_registry import CustomGradientRegistry
    from onnxruntime.training.ortmodule._custom_op_symbolic_registry import (
        CustomOpSymbolicRegistry,
    )

    symbolics = CustomOpSymbolicRegistry._SYMBOLICS
    if _STATE["originals"] is None:  # ORTModule's own: layer_norm and cross_entropy_loss, no gelu
        _STATE["originals"] = {name: symbolics.get(name) for name, _ in SYMBOLICS.values()}
    _define_library()
    _STATE["all_trainable"] = all(p.requires_grad for p in module.parameters())
    for kernel, (name, fn) in SYMBOLICS.items():
        original = _STATE["originals"][name]
        if kernel in kernels:
            symbolics[name] = fn
            for (op, overload), nodes in GRADIENTS[kernel]:
                CustomGradientRegistry.register(
                    "org.pytorch.aten", "ATen", [op, overload], lambda n=nodes: n
                )
        elif original is not None:
            symbolics[name] = original
        else:
            from ortft.export.onnx_tools import unregister_symbolics

            symbolics.pop(name, None)  # and from torch.onnx, where an earlier ORTModule put it
            unregister_symbolics([name])
