"""``--quantize int4``: weight-only int4 (MatMulNBits) for decoders (``ortft.export.int4``).

The blocks are computed in numpy (the ort profile's onnxruntime-training 1.19.2 cannot import
onnxruntime's own quantizer): onnxruntime's MatMulNBits kernel must compute with them what numpy
computes with their dequantized weights, and the consumer tier compares them with onnxruntime
1.32's ``quantize_matmul_4bits`` itself. The export reuses the task matrix's causal-lm run.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

from ortft.cli.app import app
from ortft.export import int4, parity

pytestmark = pytest.mark.xdist_group("task-matrix")  # the matrix's runs (tests/test_consumer.py)

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
    """A one-MatMul graph, quantized: onnxruntime's kernel equals x @ the dequantized weight,
    which is within half a step of each block's scale from the fp32 weight."""
    w = _weight()
    x = np.random.default_rng(5).standard_normal((3, K)).astype(np.float32)
    node = helper.make_node("MatMul", ["x", "w"], ["y"], "mm")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, K])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, N])],
        [numpy_helper.from_array(w, "w")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m")
    report = int4.quantize(tmp_path / "m", tmp_path / "q", block_size=32)
    assert report["nodes_quantized"] == {"MatMul": 1} and report["block_size"] == 32
    ops = Counter(n.op_type for n in onnx.load(str(tmp_path / "q")).graph.node)
    assert ops == {"MatMulNBits": 1}
    deq = _dequantized(w, 32)
    step = np.abs(deq - w).max(axis=0)
    assert np.all(step <= (np.ptp(np.r_[w, np.zeros((1, N))], axis=0) / 15) / 2 + 1e-6)
    got = parity.session(tmp_path / "q").run(None, {"x": x})[0]
    assert np.abs(got - x @ deq).max() < 1e-4


def test_int4_export_of_a_decoder(task_matrix, tmp_path: Path) -> None:
    """The task matrix's causal-lm (GPT-2: Conv1D layers are Gemm nodes, the head a MatMul)
    exported with --quantize int4: MatMulNBits in place of every weight, export.json's int4
    section with its settings, quality and size."""
    out = tmp_path / "exp"
    res = CliRunner().invoke(
        app, ["export", str(task_matrix.run("causal-lm")), "-o", str(out), "--quantize", "int4"]
    )
    assert res.exit_code == 0, res.stderr + str(res.exception)
    report = json.loads((out / "export.json").read_text())
    assert report["passed"] is True and report["files"]["int4"] == "model.int4.onnx"
    ops = Counter(n.op_type for n in onnx.load(str(out / "model.int4.onnx")).graph.node)
    fp32_ops = Counter(n.op_type for n in onnx.load(str(out / "model.onnx")).graph.node)
    assert ops["MatMulNBits"] == fp32_ops["Gemm"] + 1 and ops["Gemm"] == 0  # + the LM head
    q = report["int4"]
    assert (q["algorithm"], q["bits"], q["block_size"], q["symmetric"]) == ("RTN", 4, 32, False)
    assert q["nodes_quantized"] == {"Gemm": fp32_ops["Gemm"], "MatMul": 1}
    assert q["bytes"] < report["bytes"] and q["size_ratio"] < 0.8
    greedy, ppl = q["quality"]["greedy"], q["quality"]["perplexity"]
    assert greedy["prompts"] > 0 and greedy["new_tokens"] >= greedy["prompts"]
    assert greedy["tokens_equal"] >= 0.9
    assert len(greedy["first_difference"]) == greedy["prompts"]
    assert ppl["rows"] > 0 and ppl["fp32"] > 1
    assert ppl["int4"] != ppl["fp32"] and abs(ppl["relative_change"]) < 0.05
    assert np.isclose(ppl["int4"] / ppl["fp32"] - 1, ppl["relative_change"], atol=1e-3)
    assert report["latency"]["ms"].keys() == {"fp32", "int4"}


def test_int4_is_refused_for_a_model_that_does_not_generate(task_matrix, tmp_path: Path) -> None:
    res = CliRunner().invoke(
        app,
        ["export", str(task_matrix.run("sequence-classification")), "-o", str(tmp_path / "x"),
         "--quantize", "int4"],
    )  # fmt: skip
    assert res.exit_code == 2
    assert res.stderr.strip().splitlines() == [
        "error: --quantize int4 is weight-only int4 for decoders (causal-lm, instruction), not "
        "sequence-classification: use --quantize int8"
    ]
    assert not (tmp_path / "x").exists()


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
