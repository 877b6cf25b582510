"""``--quantize int4``: weight-only int4 (MatMulNBits) for decoders (``ortft.export.int4``).

The blocks are computed in numpy (the ort profile's onnxruntime-training 1.19.2 cannot import
onnxruntime's own quantizer): onnxruntime's MatMulNBits kernel must compute with them what numpy
computes with their dequantized weights, and the consumer tier compares them with onnxruntime
1.32's ``quantize_matmul_4bits`` itself. The export of a decoder, and the refusal for other
tasks, are in tests/test_task_matrix.py, on the matrix's runs.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ortft.export import int4, parity

K, N = 70, 24  # K: two whole blocks of 32 and a partial one


def _weight() -> np.ndarray:
    rng = np.random.default_rng(4)
    w = rng.standard_normal((K, N)).astype(np.float32)
    w[:, 0] = 0.0  # an all-zero column: scale 0
    w[:, 1] = np.abs(w[:, 1])  # one sign only: the range widened to hold 0
    return w


def _dequantized(w: np.ndarray, block: int) -> np.ndarray:
    """What MatMulNBits' weight is, from ``int4.blocks``: (q - zero point) * scale, per block."""
    packed, scales, zeros = int4.blocks(w, block)
    count = packed.shape[1]
    q = np.stack([packed & 15, packed >> 4], axis=-1).reshape(N, count, block).astype(np.float32)
    z = np.stack([zeros & 15, zeros >> 4], axis=-1).reshape(N, -1)[:, :count].astype(np.float32)
    values = (q - z[..., None]) * scales.reshape(N, count)[..., None]
    return values.reshape(N, -1)[:, :K].T


def test_matmulnbits_computes_with_the_blocks_what_numpy_does(tmp_path: Path) -> None:
    """A MatMul and a Gemm (GPT-2's Conv1D layers: the weight transposed, a bias) of the same
    weight, quantized: the weight's blocks once per layout, and onnxruntime's kernel equals
    x @ the dequantized weight (+ the bias), which is within half a step of each block's scale
    from the fp32 weight."""
    w = _weight()
    bias = np.linspace(-1, 1, N, dtype=np.float32)
    x = np.random.default_rng(5).standard_normal((3, K)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["y"], "mm"),
        helper.make_node("Gemm", ["x", "wt", "b"], ["z"], "gemm", transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, K])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [None, N]) for n in ("y", "z")],
        [numpy_helper.from_array(a, n) for a, n in ((w, "w"), (w.T.copy(), "wt"), (bias, "b"))],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m")
    report = int4.quantize(tmp_path / "m", tmp_path / "q", block_size=32)
    assert report["nodes_quantized"] == {"Gemm": 1, "MatMul": 1} and report["block_size"] == 32
    quantized = onnx.load(str(tmp_path / "q")).graph
    assert Counter(n.op_type for n in quantized.node) == {"MatMulNBits": 2, "Add": 1}
    assert {t.name for t in quantized.initializer} >= {"b"} and not {"w", "wt"} & {
        t.name for t in quantized.initializer
    }
    deq = _dequantized(w, 32)
    step = np.abs(deq - w).max(axis=0)
    assert np.all(step <= (np.ptp(np.r_[w, np.zeros((1, N))], axis=0) / 15) / 2 + 1e-6)
    y, z = parity.session(tmp_path / "q").run(None, {"x": x})
    assert np.abs(y - x @ deq).max() < 1e-4
    assert np.abs(z - (x @ deq + bias)).max() < 1e-4


@pytest.mark.consumer
def test_the_blocks_equal_onnxruntime_quantizer(consumer_python: str, tmp_path: Path) -> None:
    """onnxruntime 1.32's ``quantize_matmul_4bits`` (the clean runtime has it; the training
    build does not) on the same weights: equal scales, zero points and every nibble MatMulNBits
    reads (K's padding in the last block is never read)."""
    import subprocess

    w = _weight()
    np.save(tmp_path / "w.npy", w)
    code = (
        "import numpy as np, sys\n"
        "from onnxruntime.capi._pybind_state import quantize_matmul_4bits as q\n"
        f"w = np.load(sys.argv[1]); k, n, b = {K}, {N}, 32; c = -(-k // b)\n"
        "p = np.zeros((n, c, b // 2), np.uint8); s = np.zeros(n * c, np.float32)\n"
        "z = np.zeros(n * ((c + 1) // 2), np.uint8)\n"
        "q(p, np.pad(w, ((0, c * b - k), (0, 0))), s, z, b, n, k, False)\n"
        "np.savez(sys.argv[2], p=p, s=s, z=z)\n"
    )
    subprocess.run(
        [consumer_python, "-I", "-c", code, str(tmp_path / "w.npy"), str(tmp_path / "ort.npz")],
        check=True,
        timeout=120,
    )
    want = np.load(tmp_path / "ort.npz")
    packed, scales, zeros = int4.blocks(w, 32)

    def nibbles(a: np.ndarray, keep: int) -> np.ndarray:
        return np.stack([a & 15, a >> 4], axis=-1).reshape(N, -1)[:, :keep]

    assert np.array_equal(scales, want["s"])
    assert np.array_equal(nibbles(zeros, 3), nibbles(want["z"], 3))
    assert np.array_equal(nibbles(packed, K), nibbles(want["p"], K))
