"""Row gathers (``index_select`` along dim 0 of a matrix) inside ORTModule's graph as PyTorch's
kernels (``kernels.py``'s ``index_select``).

Why: ``backend.unpad`` on the ort backend gathers each layer's real positions into one
[tokens, width] matrix and back (``torch/unpad.py``'s ``arm_in_graph``). ONNX ``Gather``'s
gradient in ORT 1.19.2 is ``GatherGrad``, whose CPU kernel took 29% of the kernel time of an
unpadded MiniLM step on the long-text peer bench (ORT's session profiler, docs/backends.md),
where the unpadded step ran 0.6x the padded one. PyTorch's ``index_add`` sums the rows faster.

The forward is ``x.index_select(0, index)``, the gradient
``zeros_like(x).index_add_(0, index, grad)``: rows gathered twice get both gradients, as
``GatherGrad`` gives them. Routed when ``x`` is a float matrix and the select is along dim 0;
anything else keeps torch.onnx's ``Gather``.
"""

from __future__ import annotations

from typing import Any

import torch

from ortft.backends.ortmodule import shapes

# forward operator -> (its gradient's inputs, outputs, operator), for ORT's gradient builder
GRADIENTS = [("ortft::rows", ["GO(0)", "I(0)", "I(1)"], ["GI(0)"], "ortft::rows_backward")]
OPERATORS = [op for op, *_ in GRADIENTS]


def _backward(grad: torch.Tensor, x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(x).index_add_(0, index, grad)


def define(lib: Any, key: str) -> None:
    """The operators on ``kernels.py``'s ``ortft`` library."""
    lib.define("rows(Tensor x, Tensor index) -> Tensor")
    lib.impl("rows", lambda x, index: x.index_select(0, index), key)
    lib.define("rows_backward(Tensor grad, Tensor x, Tensor index) -> Tensor")
    lib.impl("rows_backward", _backward, key)
    shapes.register("ortft::rows", _infer_shape)


def _infer_shape(inference: Any, node: Any) -> None:
    """[len(index), x's width]."""
    (count,) = inference._get_sympy_shape(node, 1)
    _, width = inference._get_sympy_shape(node, 0)
    shapes.set_output(inference, node, [count, width])


def symbolic(g: Any, original: Any, x: Any, dim: Any, index: Any) -> Any:
    """``aten::index_select``: routed as the docstring says, else ``original``."""
    from torch.onnx import symbolic_helper as sh

    if (
        sh._maybe_get_const(dim, "i") != 0
        or sh._get_tensor_rank(x) != 2
        or sh._get_tensor_rank(index) != 1
        or x.type().scalarType() != "Float"
    ):
        return original(g, x, dim, index)
    out = g.op("org.pytorch.aten::ATen", x, index, operator_s="ortft::rows")
    sizes = sh._get_tensor_sizes(x) or [None, None]
    out.setType(x.type().with_sizes([None, sizes[1]]))
    return out
