"""2-D convolutions inside ORTModule's graph as PyTorch's (oneDNN) kernels (``kernels.py``'s
``conv``).

Why: ORT 1.19.2's CPU Conv / ConvGrad took twice PyTorch's time on the peer bench's Stable
Diffusion UNet (numbers in ``kernels.py``'s docstring). The ATen node calls
``aten::convolution`` / ``aten::convolution_backward``: PyTorch's own kernels and numerics (a
3-step text-to-image run's losses equal the torch backend's to 1e-7).

A convolution is routed when it is 2-D, not transposed, in fp32, with a bias, its weight and
bias train and its input needs a gradient. The gradient node produces all three gradients and
ORT's ATen kernel cannot leave an output out ("invalid index -1" for a convolution of the
model's input, the UNet's ``conv_in``), so a convolution whose input needs none keeps ORT's
Conv (whose ConvGrad then computes the weight's and bias's only; a second operator with a
two-output gradient, tried for it, left ORT 1.19.2's gradient builder without the weight's
gradient). Whether the input needs one is found by walking the graph back to its inputs: the
export keeps the ``requires_grad`` of the graph's inputs and parameters, not of the activations
between them.

ORTModule runs ONNX Runtime's symbolic shape inference (``auto_merge``) over the exported graph,
and that gives an ATen operator it does not know an output of fresh symbolic dims, whatever the
export said. A 1x1 output multiplied back onto a feature map (RegNet's squeeze-excitation) then
had its 1s merged with the map's height and width, Mul's gradient skipped the reduction over
them, and oneDNN got a [4, 32, 2, 2] gradient for a [4, 32, 1, 1] output ("could not create a
primitive descriptor for a convolution"). ``define`` gives the inference (``shapes.py``) the
convolution's own output shape.
"""

from __future__ import annotations

from typing import Any

import torch

from ortft.backends.ortmodule import shapes

_ARGS = "int[] stride, int[] padding, int[] dilation, int groups"
# forward operator -> (its gradient's inputs, outputs, operator), for ORT's gradient builder
_INPUTS = ["GO(0)", "I(0)", "I(1)", "I(3)", "I(4)", "I(5)", "I(6)"]
GRADIENTS = [("ortft::conv2d", _INPUTS, ["GI(0)", "GI(1)", "GI(2)"], "ortft::conv2d_backward")]
OPERATORS = [op for op, *_ in GRADIENTS]


def _forward(x: Any, w: Any, b: Any, stride: Any, padding: Any, dilation: Any, groups: int) -> Any:
    return torch.ops.aten.convolution(x, w, b, stride, padding, dilation, False, [0, 0], groups)


def _backward(
    grad: Any, x: Any, w: Any, stride: Any, padding: Any, dilation: Any, groups: int
) -> tuple[Any, ...]:
    return torch.ops.aten.convolution_backward(
        grad,
        x,
        w,
        [w.shape[0]],
        stride,
        padding,
        dilation,
        False,
        [0, 0],
        groups,
        [True, True, True],
    )


def define(lib: Any, key: str) -> None:
    """The operators on ``kernels.py``'s ``ortft`` library."""
    lib.define(f"conv2d(Tensor x, Tensor weight, Tensor bias, {_ARGS}) -> Tensor")
    lib.impl("conv2d", _forward, key)
    lib.define(
        f"conv2d_backward(Tensor grad, Tensor x, Tensor weight, {_ARGS}) -> "
        "(Tensor, Tensor, Tensor)"
    )
    lib.impl("conv2d_backward", _backward, key)
    for op in OPERATORS:
        shapes.register(op, _infer_shape)


def _infer_shape(inference: Any, node: Any) -> None:
    """ONNX Runtime's symbolic shape inference of an ``ortft::conv2d`` node: [N, C_out, H', W'],
    each H' as ONNX Conv's (its constant inputs: ``symbolic``)."""
    stride, padding, dilation = (inference._try_get_value(node, i) for i in (3, 4, 5))
    n, _, *spatial = inference._get_sympy_shape(node, 0)
    kernel = inference._get_sympy_shape(node, 1)
    shape = [n, kernel[0]] + [
        _out_size(size, kernel[2 + i], stride[i], padding[i], dilation[i])
        for i, size in enumerate(spatial)
    ]
    shapes.set_output(inference, node, shape)


def needs_grad(value: Any) -> bool:
    """Whether a value of the graph being exported depends on a graph input or parameter that
    requires grad."""
    seen, stack = set(), [value]
    while stack:
        v = stack.pop()
        if v.unique() in seen:
            continue
        seen.add(v.unique())
        if v.node().kind() == "prim::Param":
            if v.requiresGrad():
                return True
            continue
        stack.extend(v.node().inputs())
    return False


def symbolic(
    g: Any,
    original: Any,
    input: Any,
    weight: Any,
    bias: Any,
    stride: Any,
    padding: Any,
    dilation: Any,
    transposed: Any,
    *rest: Any,
) -> Any:
    """``aten::_convolution``: routed as the docstring says, else ``original`` (ORTModule's own
    export: ONNX Conv)."""
    from torch.onnx import symbolic_helper as sh

    groups = rest[1]  # rest: output_padding, groups, benchmark, ...
    ints = [sh._maybe_get_const(v, "is") for v in (stride, padding, dilation)]
    group = sh._maybe_get_const(groups, "i")
    if (
        sh._is_none(bias)
        or not (weight.requires_grad() and bias.requires_grad())
        or sh._maybe_get_const(transposed, "i")
        or sh._get_tensor_rank(weight) != 4
        or input.type().scalarType() != "Float"
        or not all(isinstance(v, list) and len(v) == 2 for v in ints)
        or not isinstance(group, int)
        or not needs_grad(input)
    ):
        return original(g, input, weight, bias, stride, padding, dilation, transposed, *rest)
    consts = [g.op("Constant", value_t=torch.tensor(v, dtype=torch.int64)) for v in (*ints, group)]
    out = g.op("org.pytorch.aten::ATen", input, weight, bias, *consts, operator_s="ortft::conv2d")
    out.setType(input.type().with_sizes(_sizes(input, weight, *ints)))
    return out


def _sizes(input: Any, weight: Any, stride: list, padding: list, dilation: list) -> list:
    """The output's sizes (None where the input's are not known: ORTModule's dynamic axes)."""
    from torch.onnx import symbolic_helper as sh

    n, _, *spatial = sh._get_tensor_sizes(input) or [None] * 4
    kernel = sh._get_tensor_sizes(weight)
    return [n, kernel[0]] + [
        None if size is None else _out_size(size, kernel[2 + i], stride[i], padding[i], dilation[i])
        for i, size in enumerate(spatial)
    ]


def _out_size(size: Any, kernel: Any, stride: int, padding: int, dilation: int) -> Any:
    """One spatial size of a convolution's output, as ONNX Conv's (an int, or a sympy dim for
    ONNX Runtime's shape inference)."""
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1
