"""Weight-only int4 (``--quantize int4``): ``model.int4.onnx``, every MatMul of a constant 2-D
fp32 weight replaced by onnxruntime's ``MatMulNBits`` (com.microsoft) over that weight in 4-bit
blocks; activations stay fp32.

The algorithm is onnxruntime's default one (``DefaultWeightOnlyQuantConfig``: round to nearest,
"RTN"), in its QOperator format: each block of ``BLOCK_SIZE`` values along K (one output
column) gets a float scale and a 4-bit zero point (asymmetric), packed two values a byte.
onnxruntime's own quantizer cannot run in the ort profile: its module
(``onnxruntime.quantization.matmul_4bits_quantizer``) imports ``quantize_matmul_4bits`` from
the C++ bindings, which onnxruntime-training 1.19.2 does not build (ImportError at import);
onnxruntime 1.32 has it (the module is ``matmul_nbits_quantizer`` there). So the blocks are
computed here in numpy: scales, zero points and every nibble MatMulNBits reads equal that
function's (tests/test_int4.py compares them in the consumer runtime's onnxruntime 1.32), and
both profiles write the same file.

Block 32: four times the scales of the quantizer's default 128, so closer to fp32, at 5.125
bits a weight (16 bytes of nibbles, a 4-byte scale and half a byte of zero point per 32
values) against 4.28. ``accuracy_level`` is left unset (0: the blocks dequantized and
multiplied in fp32), the closest to the fp32 export; 4 (int8 activations) is faster on CPUs
with int8 dot products and a runtime's choice (docs/export.md measures both).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

BLOCK_SIZE = 32
ACCURACY_LEVEL = 0
ALGORITHM = "RTN"  # onnxruntime's DEFAULT weight-only algorithm: round to nearest, per block
MAX_Q = 15  # 4 bits, unsigned


def _round(x: np.ndarray) -> np.ndarray:
    """C's ``roundf``: halves away from zero (numpy rounds them to even)."""
    return np.sign(x) * np.floor(np.abs(x) + np.float32(0.5))


def blocks(weight: np.ndarray, block_size: int = BLOCK_SIZE) -> tuple[np.ndarray, ...]:
    """(packed [N, blocks, block_size / 2] uint8, scales [N * blocks] fp32, zero points
    [N * ceil(blocks / 2)] uint8) of ``weight`` [K, N], as onnxruntime's
    ``quantize_matmul_4bits`` lays them out for MatMulNBits (asymmetric): K padded with zeros
    to whole blocks, a block's range widened to hold 0, the first value of a pair in the low
    nibble."""
    k, n = weight.shape
    count = -(-k // block_size)
    cols = np.zeros((n, count * block_size), np.float32)
    cols[:, :k] = weight.T
    cols = cols.reshape(n, count, block_size)
    low = np.minimum(cols.min(axis=-1), np.float32(0))
    high = np.maximum(cols.max(axis=-1), np.float32(0))
    scale = ((high - low) / np.float32(MAX_Q)).astype(np.float32)
    nonzero = scale != 0
    safe = np.where(nonzero, scale, np.float32(1))
    zero_fp = np.where(nonzero, np.float32(0) - low / safe, low)
    zero = np.clip(_round(zero_fp), 0, MAX_Q).astype(np.float32)
    reciprocal = np.where(nonzero, np.float32(1) / safe, np.float32(0)).astype(np.float32)
    q = np.clip(_round(cols * reciprocal[..., None]) + zero[..., None], 0, MAX_Q).astype(np.uint8)
    q.reshape(n, -1)[:, k:] = 0  # K's padding: nibbles MatMulNBits never reads
    packed = (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)
    zeros = np.zeros((n, count + count % 2), np.uint8)  # an odd count's spare nibble: unread
    zeros[:, :count] = zero.astype(np.uint8)
    packed_zeros = (zeros[:, 0::2] | (zeros[:, 1::2] << 4)).astype(np.uint8)
    return packed, scale.reshape(-1), packed_zeros.reshape(-1)


def quantize(
    src: Path, dst: Path, block_size: int = BLOCK_SIZE, accuracy_level: int = ACCURACY_LEVEL
) -> dict[str, Any]:
    """Write ``src`` with its constant-weight MatMuls (and Gemms: GPT-2's Conv1D layers) as
    MatMulNBits to ``dst``; the report (export.json's ``int4`` section starts with it). A
    weight two nodes share is quantized once; the fp32 weights nothing reads any more are
    dropped."""
    import onnx
    from onnx import helper

    from ortft.export.onnx_tools import _load, _save

    model = _load(src)
    graph = model.graph
    rewrite = _Rewrite(graph, block_size, accuracy_level)
    nodes = [new for node in graph.node for new in rewrite(node)]
    graph.ClearField("node")
    graph.node.extend(nodes)
    _drop_unread(graph)
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    _save(model, dst)
    onnx.checker.check_model(str(dst))
    return {
        "method": "MatMulNBits (com.microsoft), weight-only: onnxruntime's DEFAULT algorithm "
        "(round to nearest per block, asymmetric, QOperator format), computed in numpy",
        "algorithm": ALGORITHM,
        "bits": 4,
        "block_size": block_size,
        "symmetric": False,
        "accuracy_level": accuracy_level,
        "nodes_quantized": dict(sorted(rewrite.counts.items())),
        "weights_quantized": len(rewrite.done),
    }


class _Rewrite:
    """One node in, the nodes that replace it out: a MatMul of a constant 2-D fp32 weight
    becomes MatMulNBits; a Gemm of one (alpha 1, beta 1, A not transposed) becomes MatMulNBits
    and an Add of its bias; any other node stays."""

    def __init__(self, graph: Any, block_size: int, accuracy_level: int):
        self.graph, self.block_size, self.accuracy_level = graph, block_size, accuracy_level
        self.weights = {t.name: t for t in graph.initializer}
        self.done: dict[tuple[str, bool], list[str]] = {}  # (weight, transposed) -> its blocks
        self.counts: dict[str, int] = {}

    def __call__(self, node: Any) -> list[Any]:
        from onnx import TensorProto, helper

        if node.domain or node.op_type not in ("MatMul", "Gemm") or len(node.input) < 2:
            return [node]
        w = self.weights.get(node.input[1])
        if w is None or len(w.dims) != 2 or w.data_type != TensorProto.FLOAT:
            return [node]
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type == "Gemm" and (
            attrs.get("transA", 0) or attrs.get("alpha", 1.0) != 1 or attrs.get("beta", 1.0) != 1
        ):
            return [node]
        transposed = bool(attrs.get("transB", 0))
        k, n = (int(d) for d in (reversed(w.dims) if transposed else w.dims))
        bias = node.input[2] if node.op_type == "Gemm" and len(node.input) > 2 else ""
        out = f"{node.output[0]}_Q4" if bias else node.output[0]
        kw: dict[str, Any] = {"K": k, "N": n, "bits": 4, "block_size": self.block_size}
        if self.accuracy_level:
            kw["accuracy_level"] = self.accuracy_level
        name = f"{node.name}_Q4" if node.name else ""
        inputs = [node.input[0], *self._blocks(w, transposed)]
        new = [helper.make_node("MatMulNBits", inputs, [out], name, domain="com.microsoft", **kw)]
        if bias:
            new.append(helper.make_node("Add", [out, bias], [node.output[0]], f"{name}_bias"))
        self.counts[node.op_type] = self.counts.get(node.op_type, 0) + 1
        return new

    def _blocks(self, w: Any, transposed: bool) -> list[str]:
        """The names of ``w``'s packed blocks, scales and zero points, added once."""
        from onnx import numpy_helper

        key = (w.name, transposed)
        if key not in self.done:
            array = numpy_helper.to_array(w)
            packed, scales, zeros = blocks(array.T if transposed else array, self.block_size)
            tag = f"{w.name}_T" if transposed else w.name
            names = [f"{tag}_Q4", f"{tag}_scales", f"{tag}_zero_points"]
            for name, values in zip(names, (packed, scales, zeros), strict=True):
                self.graph.initializer.append(numpy_helper.from_array(values, name))
            self.done[key] = names
        return self.done[key]


def _drop_unread(graph: Any) -> None:
    """Remove the initializers no node reads (the fp32 weights replaced by their blocks)."""
    read = {name for node in graph.node for name in node.input}
    read |= {o.name for o in graph.output}
    keep = [t for t in graph.initializer if t.name in read]
    graph.ClearField("initializer")
    graph.initializer.extend(keep)
