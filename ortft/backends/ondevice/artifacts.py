"""On-device training artifacts: the model's loss graph, differentiated by onnxruntime-training
into ``training_model.onnx``, ``eval_model.onnx``, ``optimizer_model.onnx`` (AdamW) and
``checkpoint``, for ``onnxruntime.training.api``. ``ortft.backends.ondevice.build`` (a run with
``backend.name: ort-ondevice``) and ``ortft export --training-artifacts`` (``ForExport``) build
them here; ``check_training_artifacts`` trains a few steps on them.

Measured on torch 2.6 (TorchScript exporter) / ONNX Runtime 1.19.2 / onnx 1.17, for BERT and
GPT-2 alike: from opset 17 the exporter writes ``LayerNormalization`` as one op with only its
``Y`` output, and ORT 1.19's gradient builder for it reads the optional ``Mean`` /
``InvStdDev`` outputs, so ``generate_artifacts`` fails (``GradientBuilderBase::O ... i <
node_->OutputDefs().size()``). At opset 16 the exporter decomposes layer norm into basic ops and
the gradient graph builds. Hence ``TRAINING_OPSET = 16``, whatever the inference opset.
"""

from __future__ import annotations

import fnmatch
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ortft.core.constants import IGNORE_INDEX
from ortft.core.errors import InputError

TRAINING_OPSET = 16  # the highest opset whose training graph ORT 1.19 can differentiate (see above)
TRAINING_ARCHITECTURES = ("bert", "gpt2")  # measured; others may work but are not promised


def training_tasks() -> list[str]:
    """The tasks whose training artifacts are measured (``traits.TrainsOnDevice``, from the
    task registry)."""
    from ortft import tasks
    from ortft.tasks import traits

    return [name for name in tasks.names() if traits.ondevice(tasks.get(name))]


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
        out["labels"] = np.where(
            feeds["attention_mask"] == 1, feeds["input_ids"], IGNORE_INDEX
        ).astype(np.int64)
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


@dataclass(frozen=True)
class ForExport:
    """``ortft export --training-artifacts [--trainable GLOB]``: the exporter's training step
    (``ortft.export.exporter.TrainingStep``), which writes ``OUT/training/`` next to the
    inference graph and checks it with three steps of training on the parity samples."""

    trainable: Sequence[str] | None = None  # globs over parameter names; None: all of them

    @property
    def tasks(self) -> list[str]:
        return training_tasks()

    def __call__(
        self,
        model: torch.nn.Module,
        task: str,
        art_dir: Path,
        feeds: dict[str, np.ndarray],
        example: tuple[torch.Tensor, ...],
    ) -> dict[str, Any]:
        num_labels = int(getattr(model.config, "num_labels", 2))
        ex = {"input_ids": example[0].numpy(), "attention_mask": example[1].numpy()}
        if task != "causal-lm" and "labels" in feeds:  # causal LM labels follow the padded mask
            ex["labels"] = np.resize(feeds["labels"], 2)
        report = generate_training_artifacts(
            model, task, art_dir, training_feeds(ex, task, num_labels), trainable=self.trainable
        )
        report["check"] = check_training_artifacts(art_dir, training_feeds(feeds, task, num_labels))
        return report
