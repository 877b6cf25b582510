"""The reference logits for ``ortft export`` of an ort-ondevice run (an ONNX final/).

There is no PyTorch model to compare with, and comparing the exported copy of
final/model.onnx with final/model.onnx itself measures nothing (a difference of 0 by
construction). The reference here is computed independently of final/model.onnx: the run's
eval graph (``ondevice/artifacts/eval_model.onnx``) run by onnxruntime.training with the
checkpoint written at the run's last step, i.e. the weights training ended with. An export
that does not hold them, or whose graph computes something else, differs from it.

That checkpoint exists when ``checkpoint.save_every`` divides the number of steps (or the run
was interrupted and resumed to the end); otherwise :func:`eval_graph_logits` returns None and
the caller says that no independent reference was available.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from ortft.checkpoint import store as checkpoint


def _artifacts(model_dir: Path, summary: dict[str, Any]) -> Path | None:
    """The run's on-device training artifacts: where the summary says, else in the run dir."""
    for path in (
        summary.get("paths", {}).get("artifacts"),
        (summary.get("backend") or {}).get("artifacts"),
        model_dir.parent / "ondevice/artifacts",
    ):
        if path and (Path(path) / "eval_model.onnx").is_file():
            return Path(path)
    return None


def eval_graph_logits(
    model_dir: Path, feeds: dict[str, np.ndarray]
) -> tuple[np.ndarray, str] | None:
    """(logits, what they were computed with) for ``feeds`` (input_ids + attention_mask), or
    None when the run's eval graph or its last-step checkpoint is not there."""
    try:
        summary = json.loads((model_dir / "summary.json").read_text())
        steps = int(summary["steps"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    art = _artifacts(model_dir, summary)
    ckpt = model_dir.parent / checkpoint.checkpoint_name(steps) / "checkpoint"
    if art is None or not ckpt.exists() or not (art / "training_model.onnx").is_file():
        return None
    import onnxruntime

    from ortft.backends.ondevice.engine import training_api

    api = training_api()
    # as in training: the session warns about every unused initializer of the eval graph
    onnxruntime.set_default_logger_severity(3)
    state = api.CheckpointState.load_checkpoint(str(ckpt))
    module = api.Module(str(art / "training_model.onnx"), state, str(art / "eval_model.onnx"))
    module.eval()
    n, length = feeds["input_ids"].shape
    # the labels only feed the eval graph's loss, which is not compared: zeros of the right rank
    # (a class id per row for classification, a token id per position for language models)
    label_rank = _input_rank(art / "eval_model.onnx", "labels")
    given = {
        "input_ids": feeds["input_ids"].astype(np.int64),
        "attention_mask": feeds["attention_mask"].astype(np.int64),
        "labels": np.zeros((n,) if label_rank == 1 else (n, length), dtype=np.int64),
        "loss_scale": np.array(1.0, dtype=np.float32),  # artifacts format 2 (ondevice_build)
    }
    names = module.input_names()
    if not set(names) <= set(given) or "logits" not in module.output_names():
        return None
    outputs = module(*[given[name] for name in names])
    logits = outputs[module.output_names().index("logits")]
    what = f"the run's eval graph {art / 'eval_model.onnx'} with its step-{steps} checkpoint {ckpt}"
    return np.asarray(logits, dtype=np.float32), what


def _input_rank(model: Path, name: str) -> int:
    import onnx

    graph = onnx.load(str(model), load_external_data=False).graph
    for value in graph.input:
        if value.name == name:
            return len(value.type.tensor_type.shape.dim)
    return 1
