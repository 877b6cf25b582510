"""Cross-field rules of a recipe: combinations that cannot run are errors at validation, never
a silent fallback (fp32, a no-op) at run time. ``Recipe``'s model validators call these in
order; each raises ``ValueError`` with one line naming the fields involved.

``Recipe`` here is ``Any``: schema.py imports this module, so importing it back for the type
would be a cycle (tests/test_layout.py)."""

from __future__ import annotations

from typing import Any

from ortft import tasks
from ortft.data.spec import DataSection
from ortft.recipe import backends

Recipe = Any  # ortft.recipe.schema.Recipe, validated up to its model validators


def has_eval_data(data: DataSection) -> bool:
    return (
        bool(data.eval)
        or data.eval_fraction > 0
        or (data.format == "hub" and bool(data.eval_split))
    )


def combinations(r: Recipe) -> None:
    """Precision, device, backend, optimizer, adapter and task/architecture combinations."""
    # hardware.device=auto is checked again once resolved (runtime.check_precision).
    dtype, device = r.precision.dtype, r.hardware.device
    if dtype == "fp16" and device == "cpu":
        raise ValueError(
            "precision.dtype=fp16 needs CUDA: PyTorch has no fp16 training on cpu; "
            "use bf16 (backend.name=torch) or fp32"
        )
    if isinstance(r.deepspeed, dict):
        from ortft.recipe import deepspeed as zero

        problems = zero.check(r.deepspeed, r)
        if problems:
            raise ValueError("deepspeed: " + "; ".join(problems))
    elif isinstance(r.deepspeed, str) and not r.deepspeed.endswith(".json"):
        raise ValueError(f"deepspeed: {r.deepspeed!r} is not a .json file path")
    if r.optimizer.name == "adamw_ort_fused" and device == "cpu":
        raise ValueError("optimizer.name=adamw_ort_fused needs CUDA; use adamw on cpu")
    problems = backends.problems(r)
    if problems:
        raise ValueError("; ".join(problems))
    if r.adapter is not None and r.backend.trainable:
        raise ValueError("backend.trainable and adapter both choose what trains; use one of them")
    task_architecture(r)
    streaming(r)


def streaming(r: Recipe) -> None:
    """data.streaming: what a stream of rows cannot give (see ortft/data/streaming.py)."""
    d = r.data
    if not d.streaming:
        return
    task = tasks.get(r.task.name, r.task)
    if not r.training.max_steps:
        raise ValueError("data.streaming needs training.max_steps (a stream has no length)")
    if not d.eval and d.eval_fraction > 0:
        raise ValueError(
            "data.streaming cannot hold out data.eval_fraction of a stream; "
            "give data.eval (read in full) or set data.eval_fraction: 0"
        )
    if task.needs_labels and not d.label_names:
        raise ValueError("data.streaming needs data.label_names (a stream is read once)")
    if not task.row_local:
        raise ValueError(
            f"data.streaming: {r.task.name} tokenizes across rows (packing or row ids); "
            "it needs stored data"
        )
    if r.backend.name not in ("ort", "torch"):
        raise ValueError(f"data.streaming runs on backend.name ort or torch, not {r.backend.name}")
    if d.num_proc > 1:
        raise ValueError("data.num_proc applies to stored data; a stream tokenizes as it reads")


def task_architecture(r: Recipe) -> None:
    """A model built from_config must be a family the task can learn (Task.architectures)."""
    fc, name = r.model.from_config, r.task.name
    if fc is None:
        return
    allowed = tasks.get(name, r.task).architectures
    if fc.architecture in allowed:
        return
    if "t5" in (fc.architecture, *allowed):  # encoder-decoder vs the rest
        raise ValueError(
            f"model.from_config.architecture={fc.architecture} cannot learn {name}: "
            "seq2seq needs t5, every other task bert or gpt2"
        )
    if allowed == ("bert",):
        raise ValueError(f"{name} needs an encoder: model.from_config.architecture=bert")
    raise ValueError(
        f"model.from_config.architecture={fc.architecture} cannot learn {name} "
        f"(it needs {' or '.join(allowed)})"
    )


def eval_users(r: Recipe) -> None:
    """Early stopping, best-model selection and hpo need evals with the task's metrics."""
    t = r.training
    users: list[tuple[str, str, bool]] = []  # (who, metric, needs eval_every)
    if t.early_stopping:
        users.append(("training.early_stopping", t.early_stopping.metric, True))
    if r.checkpoint.final == "best":
        users.append(("checkpoint.final=best", r.selection_metric(), True))
    if r.hpo:
        users.append(("hpo", r.hpo.metric, r.hpo.pruning.enabled))
    metrics = tasks.get(r.task.name, r.task).eval_metrics
    for who, metric, needs_every in users:
        if metric not in metrics:
            raise ValueError(
                f"{who}: {metric} is not a metric of {r.task.name} (one of {', '.join(metrics)})"
            )
        if not has_eval_data(r.data):
            raise ValueError(f"{who} needs eval data: set data.eval or data.eval_fraction > 0")
        if needs_every and not t.eval_every:
            raise ValueError(f"{who} needs training.eval_every (evaluations during training)")
