"""What ortft does to an exported ONNX model: optimize it, convert it to fp16, quantize it to
int8, and build on-device training artifacts (``ortft.export.parity`` judges and times them).

Measured on torch 2.6 (TorchScript exporter) / ONNX Runtime 1.19.2 / onnx 1.17, for BERT and
GPT-2 alike:

- Inference: opsets 14–20 export and run; torch 2.6's TorchScript exporter stops at 20.
- Training artifacts: from opset 17 the exporter writes ``LayerNormalization`` as one op with
  only its ``Y`` output, and ORT 1.19's gradient builder for it reads the optional ``Mean`` /
  ``InvStdDev`` outputs, so ``generate_artifacts`` fails (``GradientBuilderBase::O ... i <
  node_->OutputDefs().size()``). At opset 16 the exporter decomposes layer norm into basic ops
  and the gradient graph builds. Hence ``TRAINING_OPSET = 16``, whatever the inference opset.
- ``onnxruntime.transformers``' optimizer needs ``coloredlogs``, which onnxruntime-training does
  not install; ORT's own session-level optimization (``ORT_ENABLE_EXTENDED``, saved to file)
  does the same CPU fusions (Gelu, FusedMatMul, FusedGemm, LayerNormalization) without it.
"""

from __future__ import annotations

import contextlib
import fnmatch
import logging
import shutil
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ortft.core.errors import InputError, RunError
from ortft.export.parity import IGNORE  # the label transformers' losses skip

TRAINING_OPSET = 16  # the highest opset whose training graph ORT 1.19 can differentiate (see above)
TRAINING_ARCHITECTURES = ("bert", "gpt2")  # measured; others may work but are not promised
LARGE = 2**31 - 2**27  # just under protobuf's 2 GB limit: beyond it, weights go to external data


def training_tasks() -> list[str]:
    """The tasks whose training artifacts are measured (Task.ondevice, from the task registry)."""
    from ortft import tasks

    return [name for name in tasks.names() if tasks.get(name).ondevice]


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

    large = sum(f.stat().st_size for f in src.parent.iterdir() if f.is_file()) > LARGE
    # it warns on the root logger to run its pre-processing first; ortft quantizes the plain
    # export and judges the result by its predictions instead (see parity.THRESHOLDS)
    logging.disable(logging.WARNING)
    try:
        quantize_dynamic(
            str(src), str(dst), weight_type=QuantType.QInt8, use_external_data_format=large
        )
    finally:
        logging.disable(logging.NOTSET)
    return {"method": "onnxruntime.quantization.quantize_dynamic(weight_type=QInt8)"}


# --------------------------------------------------------------------------- on-device training


class _LossOnly(torch.nn.Module):
    """The model's own loss (transformers' shift-and-mask for causal LM), as the graph's first
    output: on-device training then optimizes exactly what PyTorch training did. ``logits`` is
    the second output: eval metrics read it, and ``export_model_for_inferencing`` keeps it.
    With ``loss_scale`` (a scalar input) the loss output is ``loss * loss_scale``: the on-device
    engine feeds each micro-batch its share of the step's real tokens, so accumulated gradients
    are a token-weighted mean (as the PyTorch engine's), not a mean of per-batch means."""

    def __init__(self, model: torch.nn.Module, is_decoder: bool):
        super().__init__()
        self.model, self.is_decoder = model, is_decoder
        self.model_type = getattr(model.config, "model_type", "")

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        labels: torch.Tensor,
        loss_scale: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        kw: dict[str, Any] = {"use_cache": False} if self.is_decoder else {}
        if self.model_type in ("bert", "gpt2"):
            # Ids of shape (batch, sequence), the values the models make themselves (positions
            # 0..n-1; BERT's token types 0). Left to the model they are (1, sequence), broadcast
            # over the batch, and ORT 1.19's gradient of that lookup writes out of bounds
            # (ortft/export/lookups.py); check_embedding_indices() refuses such a graph.
            zeros = input_ids * 0  # made from input_ids: its batch dimension, at any shape
            kw["position_ids"] = zeros + torch.arange(input_ids.shape[1], device=zeros.device)
            if self.model_type == "bert":  # GPT-2 would add wte(token_type_ids) to its input
                kw["token_type_ids"] = zeros
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            labels=labels,
            return_dict=True,
            **kw,
        )
        loss = out.loss if loss_scale is None else out.loss * loss_scale
        return loss, out.logits


def training_feeds(
    feeds: dict[str, np.ndarray], task: str, num_labels: int
) -> dict[str, np.ndarray]:
    """``feeds`` with labels: the given ones, else synthetic (next token / seeded random class)."""
    out = {"input_ids": feeds["input_ids"], "attention_mask": feeds["attention_mask"]}
    if "labels" in feeds:
        out["labels"] = feeds["labels"]
    elif task == "causal-lm":
        out["labels"] = np.where(feeds["attention_mask"] == 1, feeds["input_ids"], IGNORE).astype(
            np.int64
        )
    else:
        out["labels"] = np.random.default_rng(0).integers(
            0, num_labels, len(feeds["input_ids"]), dtype=np.int64
        )
    return out


def select_trainable(names: Sequence[str], trainable: Sequence[str] | None) -> list[str]:
    """Parameter names matched by any glob in ``trainable`` (all of them when None)."""
    if trainable is None:
        return list(names)
    chosen = [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in trainable)]
    unmatched = [p for p in trainable if not any(fnmatch.fnmatchcase(n, p) for n in names)]
    if unmatched or not chosen:
        sample = ", ".join(list(names)[:3])
        raise InputError(
            f"--trainable {' '.join(unmatched) or ' '.join(trainable)} matches no parameter "
            f"(names look like: {sample}, ...)"
        )
    return chosen


def generate_training_artifacts(
    model: torch.nn.Module,
    task: str,
    out_dir: Path,
    example: dict[str, np.ndarray],
    *,
    trainable: Sequence[str] | None = None,
    opset: int = TRAINING_OPSET,
    optimizer: dict[str, Any] | None = None,
    loss_scale: bool = False,
) -> dict[str, Any]:
    """Write ``training_model.onnx``, ``eval_model.onnx``, ``optimizer_model.onnx`` (AdamW) and
    ``checkpoint`` to ``out_dir`` for ``onnxruntime.training.api``.

    ``example`` holds input_ids, attention_mask and labels (see ``training_feeds``); its last
    row must be padded so the exported graph keeps the attention mask. ``trainable`` holds glob
    patterns over the model's parameter names (``classifier.*``, ``bert.encoder.layer.1.*``);
    the others are frozen (kept in the checkpoint, no gradient). Parameters keep their Hugging
    Face names in the graph and checkpoint. The training graph outputs ``loss``, the eval
    graph ``loss`` and ``logits``.
    ``optimizer``: AdamW settings baked into the optimizer graph (``betas``, ``eps``,
    ``weight_decay``, ``max_grad_norm``); default ORT's AdamW (eps 1e-6, no decay, no clipping).
    ``loss_scale``: both graphs take a fourth input, a float scalar the loss is multiplied by
    (see ``_LossOnly``); the inference graph never needs it.
    """
    import onnxruntime as ort

    ort.set_default_logger_severity(3)  # else the gradient graph builder logs at info level
    _check_training_support(model, task, opset)
    names = [n for n, _ in model.named_parameters()]
    chosen = select_trainable(names, trainable)
    out_dir.mkdir(parents=True, exist_ok=True)
    graph, inputs = _training_graph(model, task, example, opset, out_dir / ".base.onnx", loss_scale)
    in_graph = {i.name for i in graph.graph.initializer}
    params = [n for n in names if n in in_graph]  # tied weights appear once
    requires = [n for n in params if n in chosen]
    frozen = [n for n in params if n not in chosen]
    if not requires:
        raise InputError("--trainable leaves no parameter of the exported graph to train")
    _write_artifacts(graph, requires, frozen, optimizer, out_dir)
    return {
        "opset": opset,
        "optimizer": {"name": "AdamW", "eps": 1e-6, "weight_decay": 0.0, **(optimizer or {})},
        "loss": "the model's own loss (graph output 'loss')",
        "inputs": inputs,
        "outputs": {"training": ["loss"], "eval": ["loss", "logits"]},
        "trainable_patterns": list(trainable) if trainable else None,
        "trainable_parameters": len(requires),
        "frozen_parameters": len(frozen),
        "trainable_values": int(
            sum(p.numel() for n, p in model.named_parameters() if n in requires)
        ),
        "files": sorted(p.name for p in out_dir.iterdir()),
    }


def _check_training_support(model: torch.nn.Module, task: str, opset: int) -> None:
    model_type = getattr(model.config, "model_type", "?")
    if task not in training_tasks():
        raise InputError(
            f"training artifacts are built and tested for {', '.join(training_tasks())}, not {task}"
        )
    if model_type not in TRAINING_ARCHITECTURES:
        raise InputError(
            f"training artifacts are built and tested for {', '.join(TRAINING_ARCHITECTURES)} "
            f"models, not {model_type}"
        )
    if opset > TRAINING_OPSET:
        raise InputError(
            f"training graphs need opset <= {TRAINING_OPSET} on ORT 1.19 (layer norm gradient)"
        )


def _training_graph(
    model: torch.nn.Module,
    task: str,
    example: dict[str, np.ndarray],
    opset: int,
    base: Path,
    loss_scale: bool = False,
) -> tuple[Any, list[str]]:
    """The loss graph (``_LossOnly``) as an onnx ModelProto with Hugging Face parameter names,
    and its input names; ``base`` is a scratch file, removed again."""
    import onnx

    wrapper = _LossOnly(model, task == "causal-lm")
    names = ["input_ids", "attention_mask", "labels"] + (["loss_scale"] if loss_scale else [])
    args = tuple(torch.from_numpy(example[k]) for k in names[:3])
    if loss_scale:  # a 0-d float: its value in the example does not matter to the graph
        args += (torch.tensor(1.0),)
    axes = {
        "input_ids": {0: "batch", 1: "sequence"},
        "attention_mask": {0: "batch", 1: "sequence"},
        "labels": {0: "batch", 1: "sequence"} if task == "causal-lm" else {0: "batch"},
        "logits": {0: "batch", 1: "sequence"} if task == "causal-lm" else {0: "batch"},
    }
    was_training = model.training
    try:
        # TRAINING mode keeps dropout in the graph; no constant folding keeps every parameter an
        # initializer under its own name.
        torch.onnx.export(
            wrapper,
            args,
            str(base),
            input_names=names,
            output_names=["loss", "logits"],
            opset_version=opset,
            dynamo=False,
            do_constant_folding=False,
            training=torch.onnx.TrainingMode.TRAINING,
            dynamic_axes=axes,
        )
    finally:
        model.train(was_training)
    graph = onnx.load(str(base))
    base.unlink()
    # "model.<name>" (the wrapper's attribute) back to the Hugging Face name.
    rename = {i.name: i.name.removeprefix("model.") for i in graph.graph.initializer}
    for init in graph.graph.initializer:
        init.name = rename[init.name]
    for node in graph.graph.node:
        node.input[:] = [rename.get(x, x) for x in node.input]
    check_embedding_indices(graph)
    return graph, names


def check_embedding_indices(graph: Any) -> None:
    """Refuse a loss graph that looks a parameter up by ids broadcast over the batch: ORT 1.19
    builds their gradient with out-of-bounds writes (``lookups``; _LossOnly avoids them)."""
    from ortft.export.lookups import broadcast_lookups

    data = {i.name for i in graph.graph.input} - {i.name for i in graph.graph.initializer}
    bad = broadcast_lookups(graph.graph, data)
    if bad:
        raise InputError(
            f"cannot build training artifacts: the exported graph looks up {', '.join(bad)} by "
            "indices broadcast over the batch; onnxruntime-training 1.19 can build a gradient "
            "for such a lookup that writes out of bounds (bert and gpt2 models are supported)"
        )


def _write_artifacts(
    graph: Any,
    requires: list[str],
    frozen: list[str],
    optimizer: dict[str, Any] | None,
    out_dir: Path,
) -> None:
    from onnxruntime.training import artifacts, onnxblock

    opt = dict(optimizer or {})
    clip = opt.pop("max_grad_norm", None)
    block = onnxblock.optim.AdamW(
        **opt, clip_grad=onnxblock.optim.ClipGradNorm(clip) if clip else None
    )
    # The training graph outputs the loss alone: with "logits" as a second output ORT 1.19's
    # training session aborts (BFCArena ChunkFromHandle) from batch 64 on (measured on a tiny
    # BERT). The eval graph, built from the same graph and parameters, also outputs "logits"
    # for eval metrics and export_model_for_inferencing.
    common = {
        "requires_grad": requires,
        "frozen_params": frozen,
        "loss": None,
        "loss_input_names": ["loss"],
    }
    artifacts.generate_artifacts(graph, optimizer=block, artifact_directory=str(out_dir), **common)
    with_logits = out_dir / ".with-logits"
    with_logits.mkdir()
    artifacts.generate_artifacts(
        graph, additional_output_names=["logits"], artifact_directory=str(with_logits), **common
    )
    (with_logits / "eval_model.onnx").replace(out_dir / "eval_model.onnx")
    shutil.rmtree(with_logits)


def check_training_artifacts(
    art_dir: Path, feeds: dict[str, np.ndarray], *, steps: int = 3, lr: float = 1e-3
) -> dict[str, Any]:
    """Train ``steps`` steps on one batch with ``onnxruntime.training.api``; the loss must fall.

    Nothing is saved: the artifacts stay as generated.
    """
    import onnxruntime as ort
    from onnxruntime.training import api

    ort.set_default_logger_severity(3)  # the training session warns about every unused initializer
    state = api.CheckpointState.load_checkpoint(str(art_dir / "checkpoint"))
    module = api.Module(
        str(art_dir / "training_model.onnx"), state, str(art_dir / "eval_model.onnx"), device="cpu"
    )
    optimizer = api.Optimizer(str(art_dir / "optimizer_model.onnx"), module)
    optimizer.set_learning_rate(lr)
    args = [feeds["input_ids"], feeds["attention_mask"], feeds["labels"]]
    module.train()
    losses = []
    for _ in range(steps):
        losses.append(float(module(*args)))  # the training graph outputs the loss alone
        optimizer.step()
        module.lazy_reset_grad()
    module.eval()
    after = float(module(*args)[0])  # the eval graph: (loss, logits)
    return {
        "steps": steps,
        "lr": lr,
        "batch": int(len(feeds["input_ids"])),
        "losses": [round(x, 6) for x in losses],
        "eval_loss_after": round(after, 6),
        "passed": bool(losses[-1] < losses[0]),
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
