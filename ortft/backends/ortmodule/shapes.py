"""ONNX Runtime's symbolic shape inference for ortft's ATen operators.

ORTModule runs ONNX Runtime's ``SymbolicShapeInference`` (``auto_merge``) over every exported
graph, and that gives an ATen operator it does not know an output of fresh symbolic dims,
whatever the export said (``conv.py``'s docstring has what that broke). ``register`` tells it
an operator's output shape.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# operator name -> fn(inference, node): sets the node's output value info
_RULES: dict[str, Callable[[Any, Any], None]] = {}


def register(operator: str, infer: Callable[[Any, Any], None]) -> None:
    """``infer(inference, node)`` for every ``operator`` node the inference meets (idempotent)."""
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    _RULES[operator] = infer
    init = SymbolicShapeInference.__init__
    if getattr(init, "_ortft_shapes", False):
        return

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        for op, rule in _RULES.items():
            self.aten_op_dispatcher_[op] = lambda node, rule=rule: rule(self, node)

    __init__._ortft_shapes = True  # type: ignore[attr-defined]
    SymbolicShapeInference.__init__ = __init__


def set_output(inference: Any, node: Any, shape: list[Any]) -> None:
    """The node's first output: ``shape`` (sympy dims), the element type of its first input."""
    from onnx import helper
    from onnxruntime.tools.symbolic_shape_infer import get_shape_from_sympy_shape

    inference._update_computed_dims(shape)
    dtype = inference.known_vi_[node.input[0]].type.tensor_type.elem_type
    vi = inference.known_vi_[node.output[0]]
    vi.CopyFrom(
        helper.make_tensor_value_info(node.output[0], dtype, get_shape_from_sympy_shape(shape))
    )
