"""``ortft export SOURCE``: find the model in a run folder, a checkpoint or a saved Hugging Face
model, load it (a LoRA adapter merged in on request) and export it with ``exporter.export_model``.

An ONNX final/ (``backend.name: ort-ondevice``) has no PyTorch model: it is copied, and the copy
and its variants are judged against the trained ONNX model itself, by the same rules
(``ortft.export.parity``). A failed check is a GateError naming the report.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ortft.backends.ondevice import artifacts
from ortft.backends.ondevice import reference as ondevice_reference
from ortft.core.errors import GateError, InputError, first_line
from ortft.core.reports import ExportReport
from ortft.data import checks
from ortft.export import deploy, parity
from ortft.export.exporter import (
    PARITY_SAMPLES,
    ExportOptions,
    deployable,
    export_model,
    other_runtimes,
    parity_feeds,
    prediction_positions,
    samples_source,
)
from ortft.export.parity import check_output, publish
from ortft.recipe.task import read_task
from ortft.tasks import protocols, traits

if TYPE_CHECKING:
    import torch

log = logging.getLogger("ortft")


def task_of(config: Any, model_dir: Path | None = None) -> str:
    """The task the run's recipe (``model_dir/recipe.yaml``) names; only a plain Hugging Face
    model without one falls back to the task its architecture name implies, an encoder without
    a head (``BertModel``) to the task a family exports it as (``tasks.plain_encoder``: feature
    extraction)."""
    from ortft import tasks

    recorded = read_task(model_dir / "recipe.yaml") if model_dir is not None else None
    family = tasks.plain_encoder(config) if recorded is None else None
    if family is not None:
        return family.plain_task().name
    task = recorded.name if recorded is not None else tasks.from_architecture(config)
    skip = traits.export_skip(tasks.get(task))
    if skip:
        raise InputError(f"{model_dir}: cannot export {task}: {skip}")
    return task


def _recipe_samples(model_dir: Path, tokenizer: Any, task: str, config: Any) -> Any:
    """Held-out rows from the recipe saved in final/, when its data can still be read here
    (``pkg://`` and absolute paths can; paths relative to a recipe elsewhere may not)."""
    if not (model_dir / "recipe.yaml").exists():
        return None
    from ortft import tasks
    from ortft.data import splits
    from ortft.recipe import io as recipe_io

    try:
        loaded = recipe_io.load(model_dir / "recipe.yaml")
        d = loaded.recipe.data
        if d.format == "hub" or not all(recipe_io.looks_local(v) for v in (d.train, d.eval) if v):
            return None  # never reach for the network to export
        t = tasks.get(task, loaded.recipe.task if loaded.recipe.task.name == task else None)
        seed = loaded.recipe.training.seed
        held_out = splits.load_splits(d, loaded.base_dir, t, seed=seed).eval
        rows = held_out[:PARITY_SAMPLES] if held_out is not None else []
        label2id = dict(config.label2id) if checks.needs_labels(t) else None
        return t.encode(rows, tokenizer, loaded.recipe.data, label2id) if rows else None
    except Exception as err:  # noqa: BLE001 - any failure means: use synthetic samples
        log.info(
            "parity samples: synthetic (the recipe's eval data cannot be read here: %s)",
            first_line(err),
        )
        return None


def _text_pair(model_dir: Path, task: str) -> tuple[str, str] | None:
    """A sentence-pair run's text columns, from the recipe saved in final/ (None: one text)."""
    from ortft import tasks
    from ortft.inference import pairs

    if task not in tasks.names():  # an encoder exported without a task
        return None
    return pairs.columns(model_dir, model_dir / "recipe.yaml", tasks.get(task))


def _merge_adapter(
    model: torch.nn.Module, adapter_dir: Path, checkpoint_dir: Path | None
) -> torch.nn.Module:
    """The base ``model`` with the adapter of final/adapter/ (or of a checkpoint) merged in."""
    from peft import PeftModel

    from ortft.checkpoint import store as checkpoint

    adapted = PeftModel.from_pretrained(model, str(adapter_dir))
    if checkpoint_dir is not None:  # a LoRA checkpoint holds the trainable weights only
        for p in adapted.parameters():
            p.requires_grad_(False)
        for name, p in adapted.named_parameters():
            if "lora_" in name or "modules_to_save" in name:
                p.requires_grad_(True)
        checkpoint.load_trainable(adapted, checkpoint_dir / checkpoint.ADAPTER_WEIGHTS)
    return adapted.merge_and_unload()


def export_source(
    source: Path,
    output: Path | None,
    *,
    opset: int,
    tolerance: float,
    merge_adapters: bool = False,
    training_artifacts: bool = False,
    trainable: Sequence[str] | None = None,
    **options: Any,
) -> ExportReport:
    """``ortft export``: SOURCE is a run dir (uses final/), a checkpoint or an HF model dir.

    ``options`` are ``ExportOptions``' fields: optimize, fp16, quantize, kv_cache (an ONNX
    final/ is copied as it is: its graph has no cache), check_runtimes.
    ``training_artifacts``: also write on-device training artifacts to OUT/training/
    (``artifacts.ForExport``); ``trainable``: globs over the parameters they train (default all).
    ``merge_adapters``: a LoRA run's final/ holds the base model and ``adapter/``; fold the
    adapter (from final/, or a checkpoint's ``adapter.safetensors``) into the base first.
    A failed check is a GateError naming the report.
    """
    from ortft import tasks

    if not source.exists():
        raise InputError(f"{source}: not found")
    if not source.is_dir():
        raise InputError(f"{source}: not a folder (expected a run, a checkpoint or a saved model)")
    out = output or (source / "onnx")
    check_output(out)
    model_dir, weights_dir = _model_dirs(source)
    family = tasks.folder_family(model_dir)
    if family is not None:  # a folder of a family's own layout: the family exports it
        flags = _flags(merge_adapters, training_artifacts, options)
        result = family.export_folder(model_dir, out, opset, tolerance, weights_dir, flags)
    elif (model_dir / "model.onnx").exists() and not any(model_dir.glob("*.safetensors")):
        result = _export_onnx_source(  # ort-ondevice
            model_dir, out, tolerance, training_artifacts, ExportOptions(**options)
        )
    else:
        model, tokenizer, task, config = _load_model(model_dir, weights_dir, merge_adapters)
        samples = _recipe_samples(model_dir, tokenizer, task, config)
        extras = ExportOptions(
            training=artifacts.ForExport(trainable) if training_artifacts else None,
            max_length=deploy.training_max_length(model_dir),
            task_options=read_task(model_dir / "recipe.yaml"),
            text_pair=_text_pair(model_dir, task),
            **_folder_options(model_dir, task),
            **options,
        )
        result = export_model(
            model,
            tokenizer,
            task,
            out,
            opset=opset,
            tolerance=tolerance,
            samples=samples,
            options=extras,
        )
    if not result["passed"]:
        raise GateError(
            f"export check failed: {'; '.join(result['failures'])} "
            f"(report: {Path(result['dir']) / 'export.json'})"
        )
    return result


def _folder_options(model_dir: Path, task: str) -> dict[str, Any]:
    """What the folder adds to its export's options where the exported task's family reads it
    (``ExportsPlainEncoders.plain_options``: an embedding's pooling, from the sentence-transformers
    files a sentence-embedding run's final/ holds or a plain encoder's folder came with); else
    nothing."""
    from ortft import tasks

    exported = tasks.exporting(task)
    if isinstance(exported, protocols.ExportsPlainEncoders):
        return exported.plain_options(model_dir)
    return {}


def _flags(merge_adapters: bool, training_artifacts: bool, options: dict[str, Any]) -> list[str]:
    """The command's flags for a single-graph model that were given, as typed: a family that
    exports a folder of its own refuses those it cannot honour."""
    asked = [f"--{k.replace('_', '-')}" for k in ("optimize", "fp16", "quantize") if options.get(k)]
    asked += ["--training-artifacts"] * training_artifacts + ["--merge-adapters"] * merge_adapters
    asked += ["--check-runtime"] * bool(options.get("check_runtimes"))
    return asked


def _model_dirs(source: Path) -> tuple[Path, Path]:
    """(the folder with config.json and the tokenizer, the folder with the weights): final/ for
    a run, the run's final/ and the checkpoint for a checkpoint, SOURCE for a saved model."""
    from ortft import tasks
    from ortft.checkpoint import store as checkpoint

    model_dir = source / "final" if (source / "final").is_dir() else source
    weights_dir = model_dir
    if (model_dir / checkpoint.MANIFEST).exists():  # a checkpoint: config/tokenizer from its run
        problem = checkpoint.verify(model_dir, deep=True)
        if problem:
            raise InputError(f"{model_dir}: not a usable checkpoint: {problem}")
        model_dir = model_dir.parent / "final"
        if not model_dir.is_dir():
            raise InputError(
                f"{source}: exporting a checkpoint needs its run's final/ for the config"
            )
    if tasks.folder_family(model_dir) is not None:  # the family reads its own folder
        return model_dir, weights_dir
    if not (model_dir / "config.json").exists():
        raise InputError(
            f"{model_dir}: no config.json (not a run, checkpoint or saved Hugging Face model)"
        )
    return model_dir, weights_dir


def _load_model(
    model_dir: Path, weights_dir: Path, merge_adapters: bool
) -> tuple[torch.nn.Module, Any, str, Any]:
    """(model, tokenizer, task, config) of a saved PyTorch model; a LoRA adapter merged in.
    An image model's "tokenizer" is its image processor."""
    import transformers
    from transformers import AutoConfig

    from ortft import tasks

    try:
        config = AutoConfig.from_pretrained(model_dir)
        task = task_of(config, model_dir)
        spec = tasks.exporting(task)  # a plain encoder's: the task a family exports it as
        auto = getattr(transformers, spec.auto_class)
        model = auto.from_pretrained(model_dir, attn_implementation="eager")
        adapter_dir = model_dir / "adapter"
        if (adapter_dir / "adapter_config.json").exists() != merge_adapters:
            raise InputError(
                f"{model_dir}: holds a LoRA adapter (adapter/); pass --merge-adapters to "
                "fold it into the base model before export"
                if not merge_adapters
                else f"--merge-adapters: {model_dir} holds no LoRA adapter (no adapter/)"
            )
        if merge_adapters:
            model = _merge_adapter(
                model, adapter_dir, weights_dir if weights_dir != model_dir else None
            )
        elif weights_dir != model_dir:
            from safetensors.torch import load_model

            load_model(model, str(weights_dir / "model.safetensors"))
        tokenizer = _tokenizer(model_dir, spec)
    except InputError:
        raise
    except (OSError, ValueError, KeyError, RuntimeError) as err:
        raise InputError(f"{model_dir}: cannot load the model: {first_line(err)}") from None
    return model, tokenizer, task, config


def _tokenizer(model_dir: Path, spec: Any) -> Any:
    """The tokenizer of ``model_dir``, or its processor where the task's rows are files: the
    family's own (``protocols.LoadsProcessor``: an image model's image processor on its PIL
    backend, as training ran it)."""
    if isinstance(spec, protocols.LoadsProcessor):
        return spec.processor_from_folder(model_dir, str(model_dir))
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def _export_onnx_source(
    model_dir: Path, out: Path, tolerance: float, training_artifacts: bool, options: ExportOptions
) -> ExportReport:
    """An ONNX final/ (``backend.name: ort-ondevice``): there is no PyTorch model to compare
    with, so the copy and its variants are checked against the run's eval graph with its
    last-step checkpoint (``ondevice_reference``), or, without that checkpoint, against the
    trained ONNX model itself (then ``parity.independent`` is false). Of ``options`` it reads
    the variants and ``check_runtimes`` (the copy keeps its graph: no KV cache)."""
    from transformers import AutoConfig, AutoTokenizer

    if training_artifacts:
        raise InputError(
            f"--training-artifacts: {model_dir} was trained on device; its training "
            "artifacts are in the run's ondevice/artifacts/"
        )
    if options.quantize == "int4":  # its check generates with the PyTorch model's config
        raise InputError(
            f"--quantize int4: {model_dir} was trained on device (an ONNX final/); int4 "
            "exports a PyTorch decoder: use --quantize int8"
        )
    kinds = parity.wanted(options.optimize, options.fp16, options.quantize)
    try:
        config, tokenizer = (
            AutoConfig.from_pretrained(model_dir),
            AutoTokenizer.from_pretrained(model_dir),
        )
    except (OSError, ValueError, KeyError) as err:
        raise InputError(f"{model_dir}: cannot load config/tokenizer: {first_line(err)}") from None
    task = task_of(config, model_dir)
    samples = _recipe_samples(model_dir, tokenizer, task, config)
    feeds = parity_feeds(samples, tokenizer, PARITY_SAMPLES)
    src = model_dir / "model.onnx"
    inputs = {k: feeds[k] for k in ("input_ids", "attention_mask")}
    reference = ondevice_reference.eval_graph_logits(model_dir, inputs)
    if reference is None:  # no last-step checkpoint: a copy compared with itself (0 by design)
        want = parity.run(src, inputs)
        against = f"the trained ONNX model {src} itself (no checkpoint at the last step)"
    else:
        want, against = reference
    ref = parity.Reference(
        feeds, want, prediction_positions(task), tolerance, samples_source(samples)
    )

    def build(tmp: Path) -> ExportReport:
        for f in model_dir.iterdir():
            if f.is_file() and f.name.startswith("model.onnx"):  # + external data, if any
                shutil.copy2(f, tmp / f.name)
        tokenizer.save_pretrained(tmp)
        config.save_pretrained(tmp)
        result = parity.build_report(
            tmp,
            ref,
            task=task,
            model_type=getattr(config, "model_type", None),
            opset=artifacts.TRAINING_OPSET,
            kinds=kinds,
            against=against,  # no PyTorch model: an ort-ondevice run
            independent=reference is not None,
        )
        max_length = deploy.training_max_length(model_dir)
        task_options = read_task(model_dir / "recipe.yaml")
        result = other_runtimes(tmp, result, feeds, tolerance, options.check_runtimes)
        pair = _text_pair(model_dir, task)
        return deployable(tmp, task, tokenizer, config, result, max_length, task_options, pair)

    result = publish(out, build)
    log.info(
        "exported %s (parity against the trained ONNX model: max |diff| %.2e)",
        result["dir"],
        result["parity"]["max_abs_diff"],
    )
    return result
