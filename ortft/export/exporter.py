"""ONNX export with an always-on parity check against PyTorch, and its optional extras.

The folder it writes is self-contained: ``model.onnx`` (inputs ``input_ids`` and
``attention_mask`` with dynamic batch and sequence axes, output ``logits``), the tokenizer,
the model config and ``export.json`` (the reports). On request it also holds
``model.opt.onnx`` (ORT graph optimization), ``model.fp16.onnx``, ``model.int8.onnx`` and
``training/`` (on-device training artifacts); see ``ortft.export.onnx_tools`` for what was measured.

Everything is written into a staging folder next to OUT and renamed into place at the end.
When a check fails, the staging folder becomes ``OUT.failed/`` (its export.json says why) and
OUT is left as it was.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ortft.errors import GateError, InputError, RunError
from ortft.export import ondevice_reference
from ortft.export import onnx_tools as tools

log = logging.getLogger("ortft")

EXPORT_FORMAT_VERSION = 2
# Highest opset both torch 2.6's TorchScript exporter (max 20) and ORT 1.19 accept; measured
# for BERT and GPT-2 (14–20 all export, load and match PyTorch). The recipe's default too.
DEFAULT_OPSET = 20
PARITY_SAMPLES = 64
# Reduced precision is judged by predictions, not by max |diff| (fp16 / int8 logits move by
# 1e-4 .. 1e-1 on a healthy model): the agreement of its predictions with PyTorch fp32's, and,
# when the samples have labels, the largest accuracy drop against them. Without labels the
# accuracy is measured against fp32's predictions, which is the agreement again, so only the
# agreement is gated.
THRESHOLDS = {
    "fp16": {"min_agreement": 0.99, "max_accuracy_drop": 0.01},
    "int8": {"min_agreement": 0.90, "max_accuracy_drop": 0.02},
}
QUANTIZE_CHOICES = ("int8",)
LATENCY_BATCH, LATENCY_REPEATS = 8, 10


DECODER_TASKS = ("causal-lm", "instruction")  # exported with use_cache=False
PER_TOKEN_TASKS = (*DECODER_TASKS, "token-classification", "masked-lm")  # logits per position
# ortft export SOURCE: the task a saved model's architecture name implies (first match wins)
ARCH_TASKS = (
    ("SequenceClassification", "sequence-classification"),
    ("TokenClassification", "token-classification"),
    ("QuestionAnswering", "question-answering"),
    ("MaskedLM", "masked-lm"),
    ("CausalLM", "causal-lm"),
    ("LMHead", "causal-lm"),
)


class _LogitsOnly(torch.nn.Module):
    def __init__(self, model: torch.nn.Module, is_decoder: bool):
        super().__init__()
        self.model, self.is_decoder = model, is_decoder

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        kw = {"use_cache": False} if self.is_decoder else {}
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, return_dict=True, **kw)
        if getattr(out, "logits", None) is None:  # question answering: [batch, 2 (start, end), seq]
            return torch.stack([out.start_logits, out.end_logits], dim=1)
        return out.logits


def _samples(samples: Any, tokenizer: Any, n: int) -> dict[str, np.ndarray]:
    """Up to ``n`` held-out rows (with labels when the data has them), else synthetic rows of
    random ids and random lengths, padded at the end."""
    if samples is not None and len(samples):
        batch = samples.take(np.arange(min(n, len(samples))))
        return {k: batch[k] for k in ("input_ids", "attention_mask", "labels") if k in batch}
    rng = np.random.default_rng(0)
    ids = rng.integers(0, len(tokenizer), size=(n, 32), dtype=np.int64)
    mask = (np.arange(32)[None, :] < rng.integers(8, 33, size=(n, 1))).astype(np.int64)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return {"input_ids": np.where(mask == 1, ids, pad), "attention_mask": mask}


def _tracing_example(feeds: dict[str, np.ndarray], tokenizer: Any) -> tuple[torch.Tensor, ...]:
    """Two rows, the second partly padded.

    The exporter traces one path through the model: transformers skips building the attention
    mask when a batch has no padding, and a graph traced that way would ignore
    ``attention_mask`` for good. A padded row keeps the masking in the graph.
    """
    ids = feeds["input_ids"][:2].copy()
    mask = feeds["attention_mask"][:2].copy()
    if len(ids) < 2:
        ids, mask = np.concatenate([ids, ids]), np.concatenate([mask, mask])
    cut = max(1, ids.shape[1] // 2)
    mask[1, cut:] = 0
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids[1, cut:] = pad
    return torch.from_numpy(ids), torch.from_numpy(mask)


# --------------------------------------------------------------------------- the output folder


def check_output(out: Path) -> None:
    """OUT must be creatable and, if it exists, an earlier export (it gets replaced)."""
    if out.exists() and not out.is_dir():
        raise InputError(f"{out}: exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not (out / "export.json").exists():
        raise InputError(f"{out}: exists and is not an ortft export folder; choose another -o")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise InputError(f"{out}: cannot create its parent folder ({err.strerror})") from None
    if not os.access(out.parent, os.W_OK | os.X_OK):
        raise InputError(f"{out}: cannot write in {out.parent} (permission denied)")


def _staging(out: Path) -> Path:
    check_output(out)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
    except OSError as err:
        raise InputError(f"{out}: cannot write there ({err.strerror})") from None
    return tmp


def _promote(tmp: Path, final: Path) -> None:
    """Swap ``tmp`` in as ``final``; an earlier ``final`` is removed only after the swap."""
    old = final.parent / f".{final.name}.old-{os.getpid()}"
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    shutil.rmtree(old, ignore_errors=True)


# --------------------------------------------------------------------------- export


def export_model(
    model: torch.nn.Module,
    tokenizer: Any,
    task: str,
    out_dir: Path,
    *,
    opset: int,
    tolerance: float,
    samples: Any = None,
    optimize: bool = False,
    fp16: bool = False,
    quantize: str | None = None,
    training_artifacts: bool = False,
    trainable: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Export ``model`` to ``out_dir``, check it, write export.json; return the report.

    The report's ``passed`` says whether every check passed; the folder is then ``out_dir``,
    else ``out_dir.failed`` (``report["dir"]``). Callers turn a failure into a GateError.
    """
    tmp = _staging(out_dir)
    try:
        result = _export_into(
            tmp,
            model,
            tokenizer,
            task,
            opset=opset,
            tolerance=tolerance,
            samples=samples,
            optimize=optimize,
            fp16=fp16,
            quantize=quantize,
            training_artifacts=training_artifacts,
            trainable=trainable,
        )
        (tmp / "export.json").write_text(json.dumps(result, indent=2) + "\n")
        failed = out_dir.with_name(out_dir.name + ".failed")
        final = out_dir if result["passed"] else failed
        _promote(tmp, final)
        if result["passed"]:
            shutil.rmtree(failed, ignore_errors=True)  # an earlier attempt's leftovers
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    result.update(dir=str(final), model=str(final / "model.onnx"))
    p = result["parity"]
    log.info(
        "exported %s (parity: max |diff| %.2e, agreement %.3f)%s",
        final,
        p["max_abs_diff"],
        p["prediction_agreement"],
        "" if result["passed"] else f"; FAILED: {'; '.join(result['failures'])}",
    )
    return result


def _export_into(
    tmp: Path,
    model: torch.nn.Module,
    tokenizer: Any,
    task: str,
    *,
    opset: int,
    tolerance: float,
    samples: Any,
    optimize: bool,
    fp16: bool,
    quantize: str | None,
    training_artifacts: bool,
    trainable: Sequence[str] | None,
) -> dict[str, Any]:
    import onnx

    if quantize is not None and quantize not in QUANTIZE_CHOICES:
        raise InputError(f"--quantize {quantize}: choose one of {', '.join(QUANTIZE_CHOICES)}")
    if training_artifacts and task not in tools.TRAINING_TASKS:
        raise InputError(
            f"--training-artifacts: built and tested for {', '.join(tools.TRAINING_TASKS)}, "
            f"not {task}"
        )
    model = model.eval().to("cpu")
    is_decoder = task in DECODER_TASKS
    positions = "next-token" if is_decoder else "token" if task in PER_TOKEN_TASKS else "row"
    # eval() on the wrapper itself: torch.onnx.export restores the wrapper's own mode after
    # exporting, and a wrapper left in training mode would switch dropout back on.
    wrapper = _LogitsOnly(model, is_decoder).eval()
    feeds = _samples(samples, tokenizer, PARITY_SAMPLES)
    inputs = {k: feeds[k] for k in ("input_ids", "attention_mask")}
    example = _tracing_example(feeds, tokenizer)
    path = tmp / "model.onnx"
    t0 = time.perf_counter()
    try:
        with torch.no_grad(), tools.standard_symbolics():
            torch.onnx.export(
                wrapper,
                example,
                str(path),
                input_names=["input_ids", "attention_mask"],
                output_names=["logits"],
                opset_version=opset,
                do_constant_folding=True,
                dynamo=False,
                dynamic_axes={
                    "input_ids": {0: "batch", 1: "sequence"},
                    "attention_mask": {0: "batch", 1: "sequence"},
                    "logits": (
                        {0: "batch", 1: "sequence"} if task in PER_TOKEN_TASKS else {0: "batch"}
                    ),
                },
            )
    except Exception as err:
        first = (str(err).strip().splitlines() or [""])[0][:300]
        raise RunError(
            f"ONNX export (opset {opset}) failed: {type(err).__name__}: {first}"
        ) from err
    export_s = time.perf_counter() - t0
    onnx.checker.check_model(str(path))
    tools.check_portable(path)
    with torch.no_grad():
        want = wrapper(
            torch.from_numpy(inputs["input_ids"]), torch.from_numpy(inputs["attention_mask"])
        ).numpy()
    got = tools.run(path, inputs)
    j = tools.judge(got, want, feeds, positions)
    parity = {
        "samples": int(len(inputs["input_ids"])),
        "source": "eval data" if samples is not None and len(samples) else "synthetic",
        "max_abs_diff": j["max_abs_diff"],
        "prediction_agreement": j["prediction_agreement"],
        "tolerance": tolerance,
        "passed": bool(j["max_abs_diff"] <= tolerance),
    }
    failures = (
        [] if parity["passed"] else [f"parity: max |diff| {j['max_abs_diff']:.2e} > {tolerance:g}"]
    )
    tokenizer.save_pretrained(tmp)
    model.config.save_pretrained(tmp)
    fp32_bytes = tools.dir_bytes(tmp, "model.onnx")
    result: dict[str, Any] = {
        "format_version": EXPORT_FORMAT_VERSION,
        "task": task,
        "model_type": getattr(model.config, "model_type", None),
        "opset": opset,
        "files": {"model": "model.onnx"},
        "bytes": fp32_bytes,
        "export_s": round(export_s, 3),
        "inputs": ["input_ids", "attention_mask"],
        "outputs": ["logits"],
        "parity": parity,
    }

    variants: dict[str, Path] = {}
    if optimize:
        dst = tmp / "model.opt.onnx"
        rep = tools.optimize(path, dst)
        jo = tools.judge(tools.run(dst, inputs), want, feeds, positions)
        rep.update(
            max_abs_diff=jo["max_abs_diff"],
            prediction_agreement=jo["prediction_agreement"],
            tolerance=tolerance,
            passed=bool(jo["max_abs_diff"] <= tolerance),
        )
        if not rep["passed"]:
            failures.append(f"optimize: max |diff| {jo['max_abs_diff']:.2e} > {tolerance:g}")
        result["optimize"], variants["optimized"] = rep, dst
    for kind, enabled, convert in (
        ("fp16", fp16, tools.to_fp16),
        ("int8", quantize == "int8", tools.quantize_int8),
    ):
        if not enabled:
            continue
        dst = tmp / f"model.{kind}.onnx"
        rep = convert(path, dst)
        onnx.checker.check_model(str(dst))
        rep.update(tools.judge(tools.run(dst, inputs), want, feeds, positions))
        limit = THRESHOLDS[kind]
        rep.update(
            limit,
            bytes=tools.dir_bytes(tmp, dst.name),
            size_ratio=round(tools.dir_bytes(tmp, dst.name) / fp32_bytes, 3),
            passed=bool(
                rep["prediction_agreement"] >= limit["min_agreement"]
                and (
                    rep["accuracy_against"] != "labels"
                    or rep["accuracy_delta"] >= -limit["max_accuracy_drop"]
                )
            ),
        )
        if not rep["passed"]:
            failures.append(
                f"{kind}: agreement {rep['prediction_agreement']:.3f} (min {limit['min_agreement']}), "
                f"accuracy delta {rep['accuracy_delta']:+.3f} (max drop {limit['max_accuracy_drop']})"
            )
        result[kind], variants[kind] = rep, dst
    if variants:
        result["files"].update({k: v.name for k, v in variants.items()})
        small = {k: v[:LATENCY_BATCH] for k, v in inputs.items()}
        timing = tools.latency_ms({"fp32": path, **variants}, small, repeats=LATENCY_REPEATS)
        ms = timing["run"]
        result["latency"] = {
            "batch": list(small["input_ids"].shape),
            "threads": 1,
            "method": f"median of {LATENCY_REPEATS} interleaved runs, default session options",
            "ms": ms,
            "session_load_ms": timing["load"],
            "speedup_vs_fp32": {k: round(ms["fp32"] / v, 3) for k, v in ms.items() if k != "fp32"},
        }

    if training_artifacts:
        result["training"] = _training(
            model, tokenizer, task, tmp / "training", feeds, example, trainable
        )
        result["files"]["training"] = "training/"
        if not result["training"]["check"]["passed"]:
            failures.append(
                f"training artifacts: loss did not fall {result['training']['check']['losses']}"
            )
    result["failures"], result["passed"] = failures, not failures
    return result


def _training(
    model: torch.nn.Module,
    tokenizer: Any,
    task: str,
    art_dir: Path,
    feeds: dict[str, np.ndarray],
    example: tuple[torch.Tensor, ...],
    trainable: Sequence[str] | None,
) -> dict[str, Any]:
    num_labels = int(getattr(model.config, "num_labels", 2))
    ex = {"input_ids": example[0].numpy(), "attention_mask": example[1].numpy()}
    if task != "causal-lm" and "labels" in feeds:
        ex["labels"] = np.resize(
            feeds["labels"], 2
        )  # causal LM labels follow the padded mask instead
    report = tools.generate_training_artifacts(
        model, task, art_dir, tools.training_feeds(ex, task, num_labels), trainable=trainable
    )
    report["check"] = tools.check_training_artifacts(
        art_dir, tools.training_feeds(feeds, task, num_labels)
    )
    return report


# --------------------------------------------------------------------------- ortft export SOURCE


def _task_of(config: Any) -> str:
    archs = " ".join(getattr(config, "architectures", None) or [])
    for marker, task in ARCH_TASKS:
        if marker in archs:
            return task
    raise InputError(
        f"unsupported model: cannot export a {archs or 'model without architectures'} "
        f"(supported: *ForSequenceClassification, *ForTokenClassification, "
        f"*ForQuestionAnswering, *ForMaskedLM, *ForCausalLM / *LMHeadModel)"
    )


def _first_line(err: Exception) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0][:300]


def _recipe_samples(model_dir: Path, tokenizer: Any, task: str, config: Any) -> Any:
    """Held-out rows from the recipe saved in final/, when its data can still be read here
    (``pkg://`` and absolute paths can; paths relative to a recipe elsewhere may not)."""
    if not (model_dir / "recipe.yaml").exists():
        return None
    from ortft import data, tasks
    from ortft.recipe import io as recipe_io

    try:
        loaded = recipe_io.load(model_dir / "recipe.yaml")
        d = loaded.recipe.data
        if d.format == "hub" or not all(recipe_io.looks_local(v) for v in (d.train, d.eval) if v):
            return None  # never reach for the network to export
        t = tasks.get(task, loaded.recipe.task if loaded.recipe.task.name == task else None)
        rows = data.load_splits(loaded, t).eval[:PARITY_SAMPLES]
        label2id = (
            dict(config.label2id)
            if task in ("sequence-classification", "token-classification")
            else None
        )
        return t.encode(rows, tokenizer, loaded.recipe.data, label2id) if rows else None
    except Exception as err:  # noqa: BLE001 - any failure means: use synthetic samples
        log.info(
            "parity samples: synthetic (the recipe's eval data cannot be read here: %s)",
            _first_line(err),
        )
        return None


def _merge_adapter(
    model: torch.nn.Module, adapter_dir: Path, checkpoint_dir: Path | None
) -> torch.nn.Module:
    """The base ``model`` with the adapter of final/adapter/ (or of a checkpoint) merged in."""
    from peft import PeftModel

    from ortft import checkpoint

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
    **options: Any,
) -> dict[str, Any]:
    """``ortft export``: SOURCE is a run dir (uses final/), a checkpoint or an HF model dir.

    ``options`` are export_model's: optimize, fp16, quantize, training_artifacts, trainable.
    ``merge_adapters``: a LoRA run's final/ holds the base model and ``adapter/``; fold the
    adapter (from final/, or a checkpoint's ``adapter.safetensors``) into the base first.
    """
    import transformers
    from transformers import AutoConfig, AutoTokenizer

    from ortft import checkpoint, tasks

    if not source.exists():
        raise InputError(f"{source}: not found")
    if not source.is_dir():
        raise InputError(f"{source}: not a folder (expected a run, a checkpoint or a saved model)")
    out = output or (source / "onnx")
    check_output(out)
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
    if not (model_dir / "config.json").exists():
        raise InputError(
            f"{model_dir}: no config.json (not a run, checkpoint or saved Hugging Face model)"
        )
    if (model_dir / "model.onnx").exists() and not any(model_dir.glob("*.safetensors")):
        return _export_onnx_source(model_dir, out, tolerance=tolerance, **options)  # ort-ondevice
    try:
        config = AutoConfig.from_pretrained(model_dir)
        task = _task_of(config)
        auto = getattr(transformers, tasks.get(task).auto_class)
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
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
    except InputError:
        raise
    except (OSError, ValueError, KeyError, RuntimeError) as err:
        raise InputError(f"{model_dir}: cannot load the model: {_first_line(err)}") from None
    samples = _recipe_samples(model_dir, tokenizer, task, config)
    result = export_model(
        model, tokenizer, task, out, opset=opset, tolerance=tolerance, samples=samples, **options
    )
    if not result["passed"]:
        raise GateError(
            f"export check failed: {'; '.join(result['failures'])} "
            f"(report: {Path(result['dir']) / 'export.json'})"
        )
    return result


def _export_onnx_source(
    model_dir: Path,
    out: Path,
    *,
    tolerance: float,
    optimize: bool = False,
    fp16: bool = False,
    quantize: str | None = None,
    training_artifacts: bool = False,
    trainable: Sequence[str] | None = None,
) -> dict[str, Any]:
    """An ONNX final/ (``backend.name: ort-ondevice``): there is no PyTorch model to compare
    with, so the copy and its variants are checked against the run's eval graph with its
    last-step checkpoint (``ondevice_reference``), or, without that checkpoint, against the
    trained ONNX model itself (then ``parity.independent`` is false)."""
    from transformers import AutoConfig, AutoTokenizer

    if training_artifacts:
        raise InputError(
            f"--training-artifacts: {model_dir} was trained on device; its training "
            "artifacts are in the run's ondevice/artifacts/"
        )
    if quantize is not None and quantize not in QUANTIZE_CHOICES:
        raise InputError(f"--quantize {quantize}: choose one of {', '.join(QUANTIZE_CHOICES)}")
    try:
        config, tokenizer = (
            AutoConfig.from_pretrained(model_dir),
            AutoTokenizer.from_pretrained(model_dir),
        )
    except (OSError, ValueError, KeyError) as err:
        raise InputError(f"{model_dir}: cannot load config/tokenizer: {_first_line(err)}") from None
    task = _task_of(config)
    positions = (
        "next-token" if task in DECODER_TASKS else "token" if task in PER_TOKEN_TASKS else "row"
    )
    samples = _recipe_samples(model_dir, tokenizer, task, config)
    feeds = _samples(samples, tokenizer, PARITY_SAMPLES)
    inputs = {k: feeds[k] for k in ("input_ids", "attention_mask")}
    src = model_dir / "model.onnx"
    reference = ondevice_reference.eval_graph_logits(model_dir, inputs)
    if reference is None:  # no last-step checkpoint: a copy compared with itself (0 by design)
        want = tools.run(src, inputs)
        against = f"the trained ONNX model {src} itself (no checkpoint at the last step)"
    else:
        want, against = reference
    tmp = _staging(out)
    try:
        for f in model_dir.iterdir():
            if f.is_file() and f.name.startswith("model.onnx"):  # + external data, if any
                shutil.copy2(f, tmp / f.name)
        path = tmp / "model.onnx"
        j = tools.judge(tools.run(path, inputs), want, feeds, positions)
        parity = {
            "samples": int(len(inputs["input_ids"])),
            "source": "eval data" if samples is not None and len(samples) else "synthetic",
            "against": against,  # no PyTorch model: an ort-ondevice run
            "independent": reference is not None,
            "max_abs_diff": j["max_abs_diff"],
            "prediction_agreement": j["prediction_agreement"],
            "tolerance": tolerance,
            "passed": bool(j["max_abs_diff"] <= tolerance),
        }
        failures = [] if parity["passed"] else [f"parity: max |diff| {j['max_abs_diff']:.2e}"]
        tokenizer.save_pretrained(tmp)
        config.save_pretrained(tmp)
        result: dict[str, Any] = {
            "format_version": EXPORT_FORMAT_VERSION,
            "task": task,
            "model_type": getattr(config, "model_type", None),
            "opset": tools.TRAINING_OPSET,
            "files": {"model": "model.onnx"},
            "bytes": tools.dir_bytes(tmp, "model.onnx"),
            "inputs": ["input_ids", "attention_mask"],
            "outputs": ["logits"],
            "parity": parity,
        }
        kinds = [
            ("optimize", optimize, tools.optimize, "model.opt.onnx"),
            ("fp16", fp16, tools.to_fp16, "model.fp16.onnx"),
            ("int8", quantize == "int8", tools.quantize_int8, "model.int8.onnx"),
        ]
        for kind, enabled, convert, name in kinds:
            if not enabled:
                continue
            rep = convert(path, tmp / name)
            rep.update(tools.judge(tools.run(tmp / name, inputs), want, feeds, positions))
            limit = THRESHOLDS.get(kind)
            rep["passed"] = bool(
                rep["max_abs_diff"] <= tolerance
                if limit is None
                else rep["prediction_agreement"] >= limit["min_agreement"]
            )
            if not rep["passed"]:
                failures.append(
                    f"{kind}: max |diff| {rep['max_abs_diff']:.2e}, agreement "
                    f"{rep['prediction_agreement']:.3f}"
                )
            result[kind] = rep
            result["files"]["optimized" if kind == "optimize" else kind] = name
        result["failures"], result["passed"] = failures, not failures
        (tmp / "export.json").write_text(json.dumps(result, indent=2) + "\n")
        final = out if result["passed"] else out.with_name(out.name + ".failed")
        _promote(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    result.update(dir=str(final), model=str(final / "model.onnx"))
    log.info(
        "exported %s (parity against the trained ONNX model: max |diff| %.2e)",
        final,
        parity["max_abs_diff"],
    )
    if not result["passed"]:
        raise GateError(
            f"export check failed: {'; '.join(failures)} (report: {final / 'export.json'})"
        )
    return result
