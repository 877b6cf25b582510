"""What ortft does to an exported ONNX model: optimize it, convert it to fp16, quantize it to
int8 (``ortft.export.parity`` judges and times them), and the torch.onnx helpers an export needs
(torch's own symbolics, no ATen fallbacks). The on-device training artifacts are built in
``ortft.backends.ondevice.artifacts``.

Measured on torch 2.6 (TorchScript exporter) / ONNX Runtime 1.19.2 / onnx 1.17, for BERT and
GPT-2 alike:

- Inference: opsets 14–20 export and run; torch 2.6's TorchScript exporter stops at 20.
- ``onnxruntime.transformers``' optimizer needs ``coloredlogs``, which onnxruntime-training does
  not install; ORT's own session-level optimization (``ORT_ENABLE_EXTENDED``, saved to file)
  does the same CPU fusions (Gelu, FusedMatMul, FusedGemm, LayerNormalization) without it.
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ortft.core.errors import RunError, first_line

LARGE = 2**31 - 2**27  # just under protobuf's 2 GB limit: beyond it, weights go to external data


def _load(path: Path) -> Any:
    import onnx

    return onnx.load(str(path))


def _save(model: Any, path: Path) -> None:
    import onnx

    large = sum(t.ByteSize() for t in model.graph.initializer) > LARGE
    onnx.save(model, str(path), save_as_external_data=large, location=f"{path.name}.data")


def op_counts(path: Path) -> Counter[str]:
    return Counter(n.op_type for n in _load(path).graph.node)


# --------------------------------------------------------------------------- variants


def optimize(src: Path, dst: Path) -> dict[str, Any]:
    """ORT's offline graph optimization: the session's ``ORT_ENABLE_EXTENDED`` graph, saved.

    The saved graph uses ORT's contrib ops (com.microsoft) fused for the CPU provider; run it
    with ONNX Runtime on CPU.
    """
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.optimized_model_filepath = str(dst)
    so.log_severity_level = 3
    ort.InferenceSession(str(src), so, providers=["CPUExecutionProvider"])
    before, after = op_counts(src), op_counts(dst)
    added = {op: n for op, n in sorted(after.items()) if op not in before}
    return {
        "method": "onnxruntime session optimization ORT_ENABLE_EXTENDED (CPU), saved to file",
        "nodes_before": sum(before.values()),
        "nodes_after": sum(after.values()),
        "ops_added": added,
        "ops_before": dict(before.most_common()),
        "ops_after": dict(after.most_common()),
    }


def to_fp16(src: Path, dst: Path) -> dict[str, Any]:
    """fp16 weights and compute; the inputs and ``logits`` keep their types (int64 / fp32)."""
    from onnxruntime.transformers.float16 import convert_float_to_float16
    from onnxruntime.transformers.onnx_model import OnnxModel

    # With float inputs besides the logits (a decoder's past_key_values), ORT 1.19's converter
    # appends their input Casts after the nodes that read them: the graph fails the ONNX
    # checker ("Nodes in a graph must be topologically sorted") until it is sorted again.
    model = OnnxModel(convert_float_to_float16(_load(src), keep_io_types=True))
    model.topological_sort()
    _save(model.model, dst)
    return {
        "method": "onnxruntime.transformers.float16.convert_float_to_float16(keep_io_types=True)"
    }


def quantize_int8(src: Path, dst: Path) -> dict[str, Any]:
    """Dynamic quantization: int8 weights, activations quantized per batch at run time."""
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.registry import IntegerOpsRegistry

    large = sum(f.stat().st_size for f in src.parent.iterdir() if f.is_file()) > LARGE
    # Conv stays float: ORT 1.19's CPU provider has no ConvInteger kernel, so a quantized patch
    # embedding (ViT) fails at session load (NOT_IMPLEMENTED); text models have no Conv.
    # Measured on a tiny ViT without it: max |logits diff| 4.4e-3, agreement 1.0 on 36 images.
    ops = [op for op in IntegerOpsRegistry if op != "Conv"]
    # it warns on the root logger to run its pre-processing first; ortft quantizes the plain
    # export and judges the result by its predictions instead (see parity.THRESHOLDS)
    logging.disable(logging.WARNING)
    try:
        quantize_dynamic(
            str(src),
            str(dst),
            weight_type=QuantType.QInt8,
            use_external_data_format=large,
            op_types_to_quantize=ops,
        )
    finally:
        logging.disable(logging.NOTSET)
    return {
        "method": "onnxruntime.quantization.quantize_dynamic(weight_type=QInt8)",
        "op_types": sorted(ops),
    }


@contextlib.contextmanager
def standard_symbolics() -> Iterator[None]:
    """Export with torch's own ONNX symbolics, not the ones ORTModule registered.

    ORTModule registers custom symbolics process-wide when it wraps a model (ATen fallbacks
    for ops such as embedding, and com.microsoft contrib ops). An inference export made later
    in the same process would pick them up, and its ATen nodes only run where ORTModule's
    ATen executor is loaded: the parity check in this process passes, a deployment fails.
    """
    import sys

    if "onnxruntime.training.ortmodule.ortmodule" not in sys.modules:
        yield
        return
    from onnxruntime.training.ortmodule._custom_op_symbolic_registry import CustomOpSymbolicRegistry

    unregister_symbolics(list(CustomOpSymbolicRegistry._SYMBOLICS))
    try:
        from onnxruntime.tools import pytorch_export_contrib_ops

        pytorch_export_contrib_ops.unregister()
    except Exception:  # noqa: BLE001 - best effort; check_portable has the last word
        pass
    yield  # ORTModule registers them again whenever it wraps another model


def unregister_symbolics(names: Sequence[str]) -> None:
    """Drop custom torch.onnx symbolics (``domain::op``) at every opset a caller may have used."""
    from torch.onnx import unregister_custom_op_symbolic

    torch_logger = logging.getLogger("torch.onnx")
    level = torch_logger.level
    torch_logger.setLevel(logging.ERROR)  # unregistering an opset never registered warns
    try:
        for name in names:
            for opset in range(7, 21):
                unregister_custom_op_symbolic(name, opset)
    finally:
        torch_logger.setLevel(level)


def check_portable(path: Path) -> None:
    """Refuse a graph that needs ORTModule's runtime (ATen fallback nodes)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    aten = [
        n.name or n.op_type
        for n in model.graph.node
        if n.op_type == "ATen" or n.domain == "org.pytorch.aten"
    ]
    if aten:
        raise RunError(
            f"{path}: the export contains {len(aten)} ATen fallback node(s) "
            f"({', '.join(aten[:3])}), which plain ONNX Runtime cannot run"
        )


def exporter() -> dict[str, str]:
    """export.json's ``exporter``: which torch.onnx exporter wrote the graphs, and why. ortft
    passes ``dynamo=False`` on every torch: on torch 2.6 (the ort profile) it is the default; a
    newer torch defaults to its dynamo exporter, but every graph ortft writes (decoder caches,
    speech, diffusion, preprocess) and every consumer check was built and checked on the
    TorchScript one (docs/install.md)."""
    import inspect

    import torch

    version = torch.__version__.split("+")[0]
    default = inspect.signature(torch.onnx.export).parameters["dynamo"].default
    if default is True:
        why = (
            f"torch {version} defaults to its dynamo exporter; ortft keeps the TorchScript one, "
            "on which every graph it writes and every consumer check was built and checked"
        )
    else:
        why = f"torch {version}'s default exporter"
    return {"name": "torchscript", "torch": version, "why": why}


def torch_export(
    module: Any,
    example: tuple[Any, ...],
    path: Path,
    opset: int,
    inputs: Sequence[str],
    outputs: Sequence[str],
    axes: dict[str, dict[int, str]],
) -> float:
    """torch.onnx.export to ``path`` with torch's own symbolics, checked (ONNX checker, no ATen
    fallbacks); its seconds. A failure of the tracer is one RunError line."""
    import time

    import onnx
    import torch

    t0 = time.perf_counter()
    try:
        with torch.no_grad(), standard_symbolics():
            torch.onnx.export(
                module,
                example,
                str(path),
                input_names=list(inputs),
                output_names=list(outputs),
                opset_version=opset,
                do_constant_folding=True,
                dynamo=False,
                dynamic_axes=axes,
            )
    except Exception as err:
        first = first_line(err)
        raise RunError(
            f"ONNX export (opset {opset}) failed: {type(err).__name__}: {first}"
        ) from err
    export_s = time.perf_counter() - t0
    onnx.checker.check_model(str(path))
    check_portable(path)
    return export_s
