"""The ``ort-ondevice`` training loop: ONNX Runtime's on-device training API, no PyTorch.

run(): run directory and resume -> data (numpy arrays, the same pipeline as the other
backends) -> training artifacts (built once with PyTorch by ``ondevice_build``, or given as
``model.name_or_path``) -> Module / Optimizer / CheckpointState -> loop (lr, forward+backward,
accumulate, step, log, eval, save) -> final/ (``export_model_for_inferencing``) -> summary.json.

This module imports no PyTorch: with artifacts that already exist (a resumed run, or a folder
made by ``ortft export --training-artifacts``) a run never loads it (tests/test_ondevice.py).
What differs from the PyTorch backends: the AdamW graph applies weight decay to every
trainable tensor (torch's loop spares biases and LayerNorm weights), and accumulated gradients
are summed, not averaged (Adam is invariant to that scale, up to eps).
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from ortft import checkpoint, data, tasks
from ortft.checkpoint import TrainState
from ortft.errors import GateError, InputError, Interrupted, OrtftError, RunError
from ortft.progress import Progress
from ortft.recipe.io import LoadedRecipe, dump
from ortft.recipe.schema import default_output_dir
from ortft.run import gates, report
from ortft.run.tracking import Tracker

log = logging.getLogger("ortft")

ARTIFACTS = ("training_model.onnx", "eval_model.onnx", "optimizer_model.onnx", "checkpoint")
CKPT_KIND = "ortft-ondevice-checkpoint"
INPUTS = ("input_ids", "attention_mask", "labels")


# --------------------------------------------------------------------------- run directory
# (as in train.py, which imports PyTorch and so cannot be imported here)


def resolve_run_dir(loaded: LoadedRecipe, output_dir: Path | None) -> Path:
    if output_dir is not None:
        return Path(output_dir)
    return Path(loaded.recipe.checkpoint.output_dir or default_output_dir(loaded.path))


def _find_resume(loaded: LoadedRecipe, run_dir: Path) -> Path | None:
    mode = loaded.recipe.checkpoint.resume
    if mode == "never":
        if checkpoint.list_checkpoints(run_dir):
            raise InputError(
                f"{run_dir} holds checkpoints of an earlier run and "
                "checkpoint.resume=never; choose another --output-dir or remove it"
            )
        return None
    path = checkpoint.latest_good(run_dir) if mode == "auto" else loaded.resolve_path(mode)
    if path is None:
        return None
    problem = checkpoint.verify(path) if path.is_dir() else "not a directory"
    if (
        problem is None
        and json.loads((path / checkpoint.MANIFEST).read_text()).get("kind") != CKPT_KIND
    ):
        problem = "not an ort-ondevice checkpoint (written by another backend)"
    if problem:
        raise InputError(f"checkpoint.resume: {path}: {problem}")
    return path


def _previous_summary(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / "summary.json"
    try:
        summary = json.loads(path.read_text()) if path.exists() else None
    except (OSError, ValueError):
        return None
    return summary if summary and summary.get("format_version") == report.FORMAT_VERSION else None


def lr_at(step: int, recipe: Any, total: int) -> float:
    """The learning rate for optimizer step ``step`` (0-based): transformers' schedules."""
    t = recipe.training
    warmup = t.warmup_steps or int(t.warmup_ratio * total)
    if step < warmup and t.scheduler != "constant":
        return t.lr * step / max(1, warmup)
    if t.scheduler in ("constant", "constant_with_warmup"):
        return t.lr
    progress = (step - warmup) / max(1, total - warmup)
    if t.scheduler == "cosine":
        return t.lr * max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))
    return t.lr * max(0.0, (total - step) / max(1, total - warmup))  # linear


# --------------------------------------------------------------------------- artifacts


def artifacts_dir(loaded: LoadedRecipe) -> Path | None:
    """model.name_or_path when it names on-device training artifacts (the edge workflow)."""
    value = loaded.recipe.model.name_or_path
    if not value:
        return None
    path = loaded.resolve_path(value)
    return path if (path / "training_model.onnx").exists() else None


def _meta_dir(art_dir: Path) -> Path:
    """Where the tokenizer and config.json are: with the artifacts, or (``ortft export
    --training-artifacts``'s OUT/training/) in the folder above."""
    for d in (art_dir, art_dir.parent):
        if (d / "config.json").exists():
            return d
    raise InputError(
        f"{art_dir}: no config.json here or in {art_dir.parent} (the tokenizer and "
        "config must come with the artifacts, as `ortft export --training-artifacts` "
        "writes them)"
    )


def _load_tokenizer_and_config(meta: Path) -> tuple[Any, Any]:
    from transformers import AutoConfig, AutoTokenizer

    try:
        tokenizer, config = AutoTokenizer.from_pretrained(meta), AutoConfig.from_pretrained(meta)
    except (OSError, ValueError, KeyError) as err:
        raise InputError(f"{meta}: cannot load the tokenizer/config ({err})") from None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer, config


def _check_labels(config: Any, labels: list[str] | None, art_dir: Path) -> None:
    if labels is None:
        return
    have = [str(config.id2label[i]) for i in range(len(config.id2label))]
    if have != labels:
        raise InputError(
            f"{art_dir}: the artifacts were built for labels {have}, the data has "
            f"{labels} (set data.label_names to match, or rebuild the artifacts)"
        )


def training_api() -> Any:
    """``onnxruntime.training.api``, without running ``onnxruntime/training/__init__.py``.

    In ORT 1.19 that ``__init__`` imports ``onnxruntime.training.optim``, which imports PyTorch
    (and fails where it is not installed), though the on-device API (``api/``) needs only ORT's
    C++ bindings. When the package is not imported yet, it is registered bare (its path, no
    ``__init__``) so that ``api`` loads alone; when it is (this process built the artifacts with
    PyTorch), the normal import is used.
    """
    import importlib
    import importlib.util
    import sys
    import types

    if "onnxruntime.training" not in sys.modules:
        import onnxruntime  # noqa: F401 - the parent package, which does not import PyTorch

        spec = importlib.util.find_spec("onnxruntime.training")
        if spec is None or not spec.submodule_search_locations:
            raise RunError("backend.name=ort-ondevice needs onnxruntime-training (not installed)")
        bare = types.ModuleType("onnxruntime.training")
        bare.__path__ = list(spec.submodule_search_locations)
        bare.__spec__, bare.__file__ = spec, spec.origin
        sys.modules["onnxruntime.training"] = bare
    return importlib.import_module("onnxruntime.training.api")


# --------------------------------------------------------------------------- checkpoints


def _save(run_dir: Path, state: TrainState, ckpt: Any, recipe_yaml: str, keep_last: int) -> Path:
    """``step-NNNNNN/``: ORT's checkpoint (weights + optimizer state), recipe.yaml, state.json and
    manifest.json, written into a temporary folder, fsynced, renamed (as checkpoint.save)."""
    api = training_api()

    final = run_dir / checkpoint.checkpoint_name(state.step)
    tmp = run_dir / f".{final.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        api.CheckpointState.save_checkpoint(
            ckpt, str(tmp / "checkpoint"), include_optimizer_state=True
        )
        (tmp / "recipe.yaml").write_text(recipe_yaml)
        (tmp / "state.json").write_text(json.dumps(asdict(state), indent=2))
        checkpoint.write_manifest(tmp, state.step, CKPT_KIND)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        checkpoint._fsync_dir(run_dir)
    except OSError as err:
        shutil.rmtree(tmp, ignore_errors=True)
        raise RunError(f"could not write checkpoint {final}: {err.strerror or err}") from err
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    checkpoint.prune(run_dir, keep_last)
    return final


# --------------------------------------------------------------------------- eval and final/


def _feeds(batch: dict[str, np.ndarray]) -> list[np.ndarray]:
    return [np.ascontiguousarray(batch[k], dtype=np.int64) for k in INPUTS]


def evaluate(module: Any, encoded: tasks.Encoded, task: Any, batch_size: int) -> dict[str, float]:
    """Loss over every eval row (label-weighted) and the task's metrics, from the eval graph."""
    module.eval()
    total, weight, logits_all, labels_all = 0.0, 0, [], []
    for batch in data.eval_batches(encoded, batch_size):
        valid = int(batch["_valid"])
        labels = batch["labels"]
        counted = labels[:, 1:] if getattr(task, "shift_labels", False) else labels
        n = int((counted != -100).sum())
        loss, logits = module(*_feeds(batch))
        total += float(loss) * n
        weight += n
        if task.needs_logits:
            logits_all.append(np.asarray(logits[:valid], dtype=np.float32))
            labels_all.append(labels[:valid])
    module.train()
    return task.metrics(total / max(weight, 1), logits_all, labels_all)


def _write_final(
    run_dir: Path,
    module: Any,
    tokenizer: Any,
    config: Any,
    recipe_yaml: str,
    probe: dict[str, np.ndarray],
    tolerance: float,
) -> tuple[Path, dict[str, Any]]:
    """final/: the inference graph (inputs input_ids + attention_mask, output logits), tokenizer,
    config and recipe; checked against the eval graph, which holds the same trained weights."""
    from onnxruntime import InferenceSession

    final, tmp = run_dir / "final", run_dir / ".final.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    module.eval()
    module.export_model_for_inferencing(str(tmp / "model.onnx"), ["logits"])
    _, want = module(*_feeds(probe))
    module.train()
    sess = InferenceSession(str(tmp / "model.onnx"), providers=["CPUExecutionProvider"])
    got = sess.run(["logits"], {k: probe[k].astype(np.int64) for k in INPUTS[:2]})[0]
    diff = float(np.max(np.abs(got - want)))
    parity = {
        "against": "the eval graph with the trained weights (onnxruntime.training)",
        "samples": int(len(probe["input_ids"])),
        "max_abs_diff": diff,
        "prediction_agreement": float(np.mean(got.argmax(-1) == want.argmax(-1))),
        "tolerance": tolerance,
        "passed": diff <= tolerance,
    }
    tokenizer.save_pretrained(tmp)
    config.save_pretrained(tmp)
    (tmp / "recipe.yaml").write_text(recipe_yaml)
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    return final, parity


def _peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: kilobytes


# --------------------------------------------------------------------------- the run


def run(
    loaded: LoadedRecipe,
    output_dir: Path | None = None,
    extra_gates: list[str] | None = None,
    on_eval: Callable[[int, dict[str, float]], None] | None = None,
) -> dict[str, Any]:
    """Train ``loaded`` (backend.name=ort-ondevice); the same contract as ``train.run``."""
    r, t = loaded.recipe, loaded.recipe.training
    run_dir = resolve_run_dir(loaded, output_dir)
    previous = _previous_summary(run_dir)
    if previous and previous.get("status") == "completed" and r.checkpoint.resume == "auto":
        log.info(
            "%s already holds a finished run; nothing to do "
            "(use another --output-dir to train again)",
            run_dir,
        )
        return previous
    resume_from = _find_resume(loaded, run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    task = tasks.get(r.task.name, r.task)

    # ---- data, then the artifacts (built once with PyTorch unless given), tokenizer, config
    raw = data.load_splits(loaded, task)
    labels = data.label_names(raw.train, r.data) if task.needs_labels else None
    given = artifacts_dir(loaded)
    art_dir = given or run_dir / "ondevice" / "artifacts"
    exports = 0
    if given is not None and r.backend.trainable:
        raise InputError(
            "backend.trainable: the artifacts in model.name_or_path fix what trains; "
            "remove backend.trainable (or rebuild them with --trainable)"
        )
    if given is None and not (art_dir / "artifacts.json").exists():
        from ortft.backends import ondevice_build  # the one place PyTorch is used

        tok_dir = run_dir / "tokenizer"
        ondevice_build.build(
            loaded, task, raw.train, labels, tok_dir if tok_dir.exists() else None, art_dir
        )
        exports = 1
    missing = [f for f in ARTIFACTS if not (art_dir / f).exists()]
    if missing:
        raise InputError(
            f"{art_dir}: not on-device training artifacts (missing {', '.join(missing)})"
        )
    tokenizer, config = _load_tokenizer_and_config(_meta_dir(art_dir))
    _check_labels(config, labels, art_dir)
    label2id = {name: i for i, name in enumerate(labels)} if labels else None
    train_enc, eval_enc = data.encode_splits(task, raw, tokenizer, r.data, label2id)
    per_epoch = data.batches_per_epoch(len(train_enc), t.batch_size)
    if per_epoch == 0:
        raise InputError(
            f"data.train: {len(train_enc)} examples make no batch of "
            f"training.batch_size={t.batch_size}"
        )

    # ---- ONNX Runtime training session: the weights (and AdamW state) live in the checkpoint
    import onnxruntime as ort

    api = training_api()
    ort.set_default_logger_severity(3)  # the session warns about every frozen initializer
    # auto: cuda only with a GPU present (a CUDA build of ORT lists its provider regardless)
    device = (
        "cuda"
        if (
            r.hardware.device == "cuda"
            or (
                r.hardware.device == "auto"
                and Path("/dev/nvidia0").exists()
                and "CUDAExecutionProvider" in ort.get_available_providers()
            )
        )
        else "cpu"
    )
    state = TrainState()
    if resume_from is not None:
        state = TrainState(**json.loads((resume_from / "state.json").read_text()))
        log.info("resuming from %s (step %d)", resume_from, state.step)
    try:
        ckpt = api.CheckpointState.load_checkpoint(str((resume_from or art_dir) / "checkpoint"))
        module = api.Module(
            str(art_dir / "training_model.onnx"),
            ckpt,
            str(art_dir / "eval_model.onnx"),
            device=device,
        )
        optimizer = api.Optimizer(str(art_dir / "optimizer_model.onnx"), module)
    except Exception as err:  # noqa: BLE001 - ORT raises RuntimeError / its own Fail types
        first = (str(err).strip().splitlines() or [type(err).__name__])[-1]
        raise RunError(
            f"onnxruntime.training could not open {art_dir} on {device}: {first[:300]}"
        ) from err
    n_train, n_all = module.get_parameters_size(True), module.get_parameters_size(False)
    log.info(
        "backend: ort-ondevice (onnxruntime.training.api on %s); %s; %d of %d parameters train",
        device,
        art_dir,
        n_train,
        n_all,
    )
    module.train()

    steps = max(
        1, t.max_steps or math.ceil((t.epochs or 1.0) * per_epoch / t.gradient_accumulation_steps)
    )
    recipe_yaml = dump(r, base_dir=loaded.base_dir)
    metrics_log = Tracker(
        run_dir, r.logging, truncate_after_step=state.step if resume_from else None
    )
    summary: dict[str, Any] = {
        "format_version": report.FORMAT_VERSION,
        "status": "running",
        "error": None,
        "task": task.name,
        "max_steps": steps,
        "parameters": n_all,
        "trainable_parameters": n_train,
        "provenance": {
            **report.provenance(loaded.path, loaded.sha256),
            "device": device,
            "threads": r.hardware.threads or os.cpu_count(),
        },
        "paths": {
            "run_dir": str(run_dir),
            "final": None,
            "artifacts": str(art_dir),
            "recipe": str(loaded.path.resolve()) if loaded.path else None,
            "onnx": None,
            "checkpoints": [],
            "last_checkpoint": str(resume_from) if resume_from else None,
        },
        "export": None,
        "resumed_from": str(resume_from) if resume_from else None,
    }
    accum = t.gradient_accumulation_steps
    batches = data.train_batches(
        train_enc, t.batch_size, t.seed, r.data.shuffle, start_micro=state.micro_step
    )
    progress = Progress(total=steps, start=state.step)
    steady: dict[str, float] = {"time": 0.0, "samples": 0, "tokens": 0, "first_step_s": 0.0}
    received: list[int] = []

    def finish(status: str, error: str | None = None, write: bool = True) -> dict[str, Any]:
        summary.update(
            {
                "status": status,
                "error": error,
                "backend": {
                    "requested": "ort-ondevice",
                    "used": "ort-ondevice",
                    "fallback": False,
                    "fallback_reason": None,
                    "ort_exports": exports,
                    "pytorch_kernels": {},
                    "notes": [
                        "onnxruntime.training.api; PyTorch only to build the artifacts"
                        if exports
                        else "onnxruntime.training.api; no PyTorch"
                    ],
                    "peak_rss_mb": round(_peak_rss_mb(), 1),
                },
                "steps": state.step,
                "epochs": state.micro_step / per_epoch,
                "samples": state.samples,
                "tokens": state.tokens,
                "metrics": {
                    "train_loss": state.last_train_loss,
                    **{f"eval_{k}": v for k, v in state.eval_metrics.items()},
                },
                "throughput": report.throughput(steady),
                "train_time_s": state.train_time_s,
                "wall_time_s": time.time() - started,
            }
        )
        summary["paths"]["checkpoints"] = [str(p) for p in checkpoint.list_checkpoints(run_dir)]
        summary["provenance"]["finished_at"] = report.utc_now()
        if write:
            metrics_log.close()
            report.write_json_atomic(run_dir / "summary.json", summary)
        return summary

    def save() -> Path:
        path = _save(run_dir, state, ckpt, recipe_yaml, r.checkpoint.keep_last)
        summary["paths"]["last_checkpoint"] = str(path)
        return path

    # ---- the loop: first SIGINT/SIGTERM finishes the step, checkpoints and stops
    old = {
        s: signal.signal(s, lambda signum, _f: received.append(signum))
        for s in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        with progress:
            window_t, window_samples, window_tokens = 0.0, 0, 0
            while state.step < steps:
                t0 = time.perf_counter()
                lr = lr_at(state.step, r, steps)
                optimizer.set_learning_rate(lr)
                loss_sum, step_tokens = 0.0, 0
                for _ in range(accum):  # gradients add up in the module until lazy_reset_grad
                    epoch, batch = next(batches)
                    loss_sum += float(module(*_feeds(batch)))  # training graph: the loss alone
                    state.micro_step += 1
                    state.epoch = epoch
                    step_tokens += int(batch["attention_mask"].sum())
                optimizer.step()
                module.lazy_reset_grad()
                state.step += 1
                loss_value = loss_sum / accum
                dt = time.perf_counter() - t0
                state.train_time_s += dt
                window_t += dt
                state.samples += t.batch_size * accum
                state.tokens += step_tokens
                window_samples += t.batch_size * accum
                window_tokens += step_tokens
                if steady["first_step_s"] == 0.0:  # session warm-up: reported apart
                    steady["first_step_s"] = dt
                else:
                    steady["time"] += dt
                    steady["samples"] += t.batch_size * accum
                    steady["tokens"] += step_tokens
                if not math.isfinite(loss_value):
                    raise RunError(f"loss is {loss_value} at step {state.step}")
                state.last_train_loss = loss_value
                progress.update(state.step, loss=loss_value)
                if state.step % t.log_every == 0 or state.step == steps:
                    metrics_log.write(
                        {
                            "kind": "train",
                            "step": state.step,
                            "epoch": state.micro_step / per_epoch,
                            "loss": loss_value,
                            "lr": lr,
                            "samples_per_s": window_samples / window_t,
                            "tokens_per_s": window_tokens / window_t,
                            "step_time_s": round(dt, 6),
                            "time_s": round(time.time() - started, 3),
                        }
                    )
                    progress.log(
                        f"step {state.step}/{steps}  loss {loss_value:.4f}  lr {lr:.2e}  "
                        f"{window_samples / window_t:.1f} samples/s"
                    )
                    window_t, window_samples, window_tokens = 0.0, 0, 0
                if eval_enc is not None and (
                    (t.eval_every and state.step % t.eval_every == 0) or state.step == steps
                ):
                    state.eval_metrics = evaluate(module, eval_enc, task, t.batch_size)
                    metrics_log.write(
                        {
                            "kind": "eval",
                            "step": state.step,
                            "epoch": state.micro_step / per_epoch,
                            **state.eval_metrics,
                        }
                    )
                    progress.eval(state.eval_metrics)
                    if on_eval is not None:
                        on_eval(state.step, state.eval_metrics)
                if r.checkpoint.save_every and state.step % r.checkpoint.save_every == 0:
                    save()
                if received:
                    path = save()
                    finish("interrupted", f"stopped by signal {received[0]} at step {state.step}")
                    raise Interrupted(
                        f"interrupted at step {state.step}; checkpoint {path}; "
                        "run the same command again to resume",
                        received[0],
                    )
    except OrtftError as err:
        if summary["status"] == "running":
            finish(getattr(err, "run_status", "failed"), str(err))
        raise
    except Exception as err:
        finish("failed", f"{type(err).__name__}: {err}")
        first = (str(err).strip().splitlines() or [""])[0]
        raise RunError(
            f"training failed at step {state.step}: {type(err).__name__}: {first[:300]}"
        ) from err
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)

    # ---- final/ (the inference graph, checked against the eval graph), gates, summary
    probe = next(data.eval_batches(eval_enc or train_enc, t.batch_size))
    final_dir, parity = _write_final(
        run_dir, module, tokenizer, config, recipe_yaml, probe, r.export.tolerance
    )
    summary["paths"]["final"] = summary["paths"]["onnx"] = str(final_dir)
    summary["export"] = {
        "dir": str(final_dir),
        "model": str(final_dir / "model.onnx"),
        "parity": parity,
        "passed": parity["passed"],
        "note": "final/model.onnx is the trained ONNX model; `ortft export RUN` "
        "adds optimized / fp16 / int8 variants",
    }
    gate_list = [gates.parse(g) for g in [*r.gates, *(extra_gates or [])]]
    gate_list.append(gates.Gate("export.max_abs_diff", "<=", r.export.tolerance))
    results = gates.check(gate_list, finish("completed", write=False))
    summary["gates"] = gates.as_dicts(results)
    summary = finish("completed")
    (final_dir / "README.md").write_text(report.model_card(summary, r))
    report.write_json_atomic(final_dir / "summary.json", summary)
    log.info(
        "done: %d steps, backend ort-ondevice, %.1f samples/s, peak RSS %.0f MB",
        state.step,
        summary["throughput"]["samples_per_s"],
        summary["backend"]["peak_rss_mb"],
    )
    for res in results:
        (log.info if res.passed else log.error)("%s", res.line())
    failed = [res for res in results if not res.passed]
    if failed:
        raise GateError(
            f"{len(failed)} of {len(results)} quality gate(s) failed: "
            + ", ".join(res.gate for res in failed),
            summary=summary,
        )
    return summary
