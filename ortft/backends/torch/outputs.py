"""What the torch-based engine writes besides its steps: checkpoints (its own, or with
DeepSpeed's partitions), final/ (a Hugging Face folder; a LoRA run's adapter beside it; a
family's own files or layout) and the ONNX export. The engine's methods delegate here; under
torchrun rank 0 writes, and every rank resumes from the same folder.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from ortft.backends.torch import amp, distributed, models
from ortft.checkpoint import store as checkpoint
from ortft.checkpoint.store import TrainState
from ortft.core.reports import ExportReport
from ortft.tasks import protocols, traits
from ortft.tasks.protocols import pairs_of

log = logging.getLogger("ortft")

CHECKPOINT_KIND = "ortft-checkpoint"
# optimizer and scheduler in DeepSpeed's format (deepspeed/), partitioned over the processes
DEEPSPEED_CHECKPOINT_KIND = "ortft-deepspeed-checkpoint"


def checkpoint_kind(recipe: Any) -> str:
    return CHECKPOINT_KIND if recipe.deepspeed is None else DEEPSPEED_CHECKPOINT_KIND


def save_checkpoint(
    run_dir: Path,
    state: TrainState,
    *,
    recipe: Any,
    recipe_yaml: str,
    keep_last: int,
    model: Any,
    optimizer: Any,
    scheduler: Any,
    scaler: Any,
    task: Any,
    deepspeed_engine: Any,
) -> Path | None:
    """A step's checkpoint; None on the ranks that do not write it. With DeepSpeed every rank
    writes its ZeRO partition first (DeepSpeed's format), and the checkpoint holds that folder
    in place of the optimizer and scheduler."""
    folders = None
    if deepspeed_engine is not None:
        from ortft.backends.torch import deepspeed

        saved = deepspeed.save_partitions(deepspeed_engine, run_dir, state.step)
        folders = {deepspeed.FOLDER: saved}
    if not distributed.is_main():
        return None
    # what the checkpoint keeps of the task besides the model (text-to-image's EMA)
    task_state = task.state_dict() if isinstance(task, protocols.TrainsState) else None
    return checkpoint.save(
        run_dir,
        state,
        model,
        None if folders else optimizer,
        None if folders else scheduler,
        recipe_yaml,
        keep_last,
        scaler=amp.scaler_state(scaler),
        kind=checkpoint_kind(recipe),
        folders=folders,
        task_state=task_state,
    )


def checkpoint_problem(path: Path, recipe: Any) -> str | None:
    """Why ``path`` cannot resume this run (another kind; DeepSpeed partitions for another
    number of processes), or None."""
    problem = checkpoint.kind_problem(path, checkpoint_kind(recipe))
    if problem is None and recipe.deepspeed is not None:
        from ortft.backends.torch import deepspeed

        problem = deepspeed.partition_problem(path, distributed.world_size())
    return problem


def write_final(folder: Path, model: Any, task: Any) -> None:
    """A Hugging Face model folder. A LoRA run's holds the base model (frozen weights, trained
    head) and, in adapter/, the adapter in PEFT's format (`ortft export --merge-adapters`
    merges them); then the task's own files (``protocols.WritesExtras``: a sentence-embedding
    run's sentence-transformers modules). A family with a layout of its own writes it
    (``protocols.SavesFinal``)."""
    if isinstance(task, protocols.SavesFinal):  # text-to-image: a diffusers folder
        task.save_final(folder, model)
        return
    if models.is_adapted(model):
        import copy

        copy.deepcopy(model).unload().save_pretrained(folder)
        model.save_pretrained(folder / "adapter")
    else:
        model.save_pretrained(folder)
    if isinstance(task, protocols.WritesExtras):  # sentence-transformers' modules
        task.write_extras(folder, model)


def export(
    run_dir: Path,
    final_dir: Path,
    samples: Any,
    *,
    recipe: Any,
    model: Any,
    tokenizer: Any,
    task: Any,
) -> ExportReport | None:
    """The ONNX export (``export:``), checked against the model; None where it is off."""
    spec = recipe.export
    if not spec.enabled:
        return None
    if isinstance(task, protocols.OwnsFolders):  # exported from final/, its own folder
        return task.export_folder(final_dir, run_dir / "onnx", spec.opset, spec.tolerance)
    skip = traits.export_skip(task)
    if skip:  # a task the exporter cannot write: say so, do not fail
        log.info("ONNX export skipped for %s: %s", task.name, skip)
        return {"skipped": skip}
    from ortft.export import exporter

    # a LoRA model is exported merged: the adapter folded into the base weights
    return exporter.export_model(
        models.merged_copy(model),
        tokenizer,
        task.name,
        run_dir / "onnx",
        opset=spec.opset,
        tolerance=spec.tolerance,
        samples=samples,
        options=exporter.ExportOptions(
            max_length=recipe.data.max_length,
            kv_cache=spec.kv_cache,
            task_options=recipe.task,
            pooling=getattr(task, "pooling", None),
            text_pair=pairs_of(task, recipe.data),
        ),
    )
