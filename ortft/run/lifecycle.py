"""The training loop: read top to bottom.

run(): resolve the run directory and whether to resume -> data -> tokenizer -> model ->
backend.wrap -> optimizer + scheduler -> [resume state] -> loop (forward, backward,
accumulate, clip, step, log, eval, save) -> final/ + ONNX export -> summary.json.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import shlex
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ortft import backends, checkpoint, data, models, runtime, tasks
from ortft.backends import distributed
from ortft.errors import GateError, InputError, Interrupted, OrtftError, RunError
from ortft.progress import Progress
from ortft.recipe.io import LoadedRecipe, dump
from ortft.recipe.schema import default_output_dir
from ortft.run import gates, report
from ortft.run.early_stopping import Selector, save_best
from ortft.run.tracking import Tracker

log = logging.getLogger("ortft")


class _Signals:
    """First SIGINT/SIGTERM: finish the step, checkpoint, stop. Second: stop at once."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._old: dict[int, Any] = {}

    def __enter__(self) -> _Signals:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.received is not None:
            raise KeyboardInterrupt
        self.received = signum
        log.warning(
            "signal %d: finishing this step, then saving a checkpoint (again to abort)", signum
        )

    def __exit__(self, *exc: Any) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


def resolve_run_dir(loaded: LoadedRecipe, output_dir: Path | None) -> Path:
    if output_dir is not None:
        return Path(output_dir)
    if loaded.recipe.checkpoint.output_dir:
        return Path(loaded.recipe.checkpoint.output_dir)
    return default_output_dir(loaded.path)


def _make_run_dir(run_dir: Path) -> None:
    """Create the run directory and prove it is writable, before any work is done."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise InputError(
            f"output dir {run_dir} is not writable ({err.strerror or err}); "
            "choose another --output-dir or checkpoint.output_dir"
        ) from None


def _find_resume(loaded: LoadedRecipe, run_dir: Path) -> Path | None:
    mode = loaded.recipe.checkpoint.resume
    if mode == "never":
        if checkpoint.list_checkpoints(run_dir):
            raise InputError(
                f"{run_dir} holds checkpoints of an earlier run and checkpoint.resume=never; "
                "choose another --output-dir or remove it"
            )
        return None
    if mode == "auto":
        return checkpoint.latest_good(run_dir)
    path = loaded.resolve_path(mode)
    problem = checkpoint.verify(path) if path.is_dir() else "not a directory"
    if problem:
        raise InputError(f"checkpoint.resume: {path}: {problem}")
    return path


def _previous_summary(run_dir: Path) -> dict[str, Any] | None:
    import json

    path = run_dir / "summary.json"
    if not path.exists():
        return None
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if summary.get("format_version") != report.FORMAT_VERSION:
        raise InputError(
            f"{path}: format_version {summary.get('format_version')} is not one this "
            f"ortft reads ({report.FORMAT_VERSION}); use another --output-dir"
        )
    return summary


def build_optimizer(params: list[torch.nn.Parameter], recipe: Any, device: torch.device) -> Any:
    o, t = recipe.optimizer, recipe.training
    if o.name == "adamw_ort_fused":
        from onnxruntime.training.optim import FusedAdam

        return FusedAdam(params, lr=t.lr, betas=o.betas, eps=o.eps, weight_decay=t.weight_decay)
    impl = o.implementation
    kw: dict[str, Any] = {}
    if impl in ("auto", "fused"):
        kw["fused"] = True  # torch 2.6 has fused AdamW kernels for CPU and CUDA
    elif impl == "foreach":
        kw["foreach"] = True
    else:
        kw["foreach"] = False
    # no weight decay on biases and LayerNorm weights (1-D tensors)
    groups = [
        {"params": [p for p in params if p.ndim > 1], "weight_decay": t.weight_decay},
        {"params": [p for p in params if p.ndim <= 1], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=t.lr, betas=o.betas, eps=o.eps, **kw)


def total_steps(recipe: Any, n_train: int, world: int = 1) -> int:
    t = recipe.training
    if t.max_steps:
        return t.max_steps
    per_epoch = (
        data.batches_per_epoch(n_train, t.batch_size * world) / t.gradient_accumulation_steps
    )
    return max(1, math.ceil((t.epochs or 1.0) * per_epoch))


def _to_device(batch: dict[str, np.ndarray], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(v).to(device) for k, v in batch.items() if not k.startswith("_")}


def evaluate(
    wrapped: torch.nn.Module,
    encoded: tasks.Encoded,
    task: Any,
    batch_size: int,
    device: torch.device,
    seed: int = 0,
    model: torch.nn.Module | None = None,
    tokenizer: Any = None,
) -> dict[str, float]:
    """Loss over every eval row (label-weighted) plus the task's metrics; a task with
    ``generate_metrics`` also decodes a few rows with the plain PyTorch ``model``."""
    wrapped.eval()
    total, weight, logits_all, labels_all = 0.0, 0, [], []
    collate = getattr(task, "collate", None)
    with torch.no_grad():
        for batch in data.eval_batches(encoded, batch_size):
            if collate is not None:
                batch = collate(batch, None, seed)  # None: the task's fixed eval variant
            valid = int(batch["_valid"])
            labels = batch["labels"]
            counted = labels[:, 1:] if getattr(task, "shift_labels", False) else labels
            n = int((counted != -100).sum())
            loss, logits = wrapped(**_to_device(batch, device))
            total += float(loss) * n
            weight += n
            if task.needs_logits:
                logits_all.append(logits[:valid].float().cpu().numpy())
                labels_all.append(labels[:valid])
    wrapped.train()
    metrics = task.metrics(total / max(weight, 1), logits_all, labels_all)
    if hasattr(task, "generate_metrics") and model is not None:
        metrics.update(task.generate_metrics(model, tokenizer, encoded))
    return metrics


def run(
    loaded: LoadedRecipe,
    output_dir: Path | None = None,
    extra_gates: list[str] | None = None,
    on_eval: Callable[[int, dict[str, float]], None] | None = None,
) -> dict[str, Any]:
    """Train ``loaded``; ``on_eval(step, metrics)`` is called after every eval (ortft hpo's hook:
    it may raise ``errors.Stopped`` to end the run, recorded as status "pruned")."""
    r = loaded.recipe
    if r.backend.name == "ort-ondevice":  # its own loop, in onnxruntime.training.api
        from ortft.backends import ondevice as train_ondevice

        return train_ondevice.run(loaded, output_dir, extra_gates, on_eval)
    t = r.training
    run_dir = resolve_run_dir(loaded, output_dir)
    previous = _previous_summary(run_dir)
    if previous and previous.get("status") == "completed" and r.checkpoint.resume == "auto":
        log.info(
            "%s already holds a finished run; nothing to do "
            "(use another --output-dir to train again)",
            run_dir,
        )
        if previous.get("provenance", {}).get("recipe_sha256") != loaded.sha256:
            log.warning("the recipe changed since that run finished")
        if extra_gates:  # a CI re-run still gets its verdict, from the recorded summary
            results = gates.check([gates.parse(g) for g in extra_gates], previous)
            previous["gates"] = [*(previous.get("gates") or []), *gates.as_dicts(results)]
            _raise_failed_gates(results, previous)
        return previous
    resume_from = _find_resume(loaded, run_dir)
    _make_run_dir(run_dir)
    checkpoint.remove_stale_temp(run_dir)  # leftovers of a save that kill -9 interrupted

    started = time.time()
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # ortft reports its own progress on stderr
    rt = runtime.resolve(r.hardware)
    runtime.check_precision(
        r.precision.dtype, r.backend.name, rt.device
    )  # device=auto is known now
    # ---- DDP under torchrun: join the process group (a no-op in one process); cuda:LOCAL_RANK
    rt = dataclasses.replace(rt, device=distributed.setup(rt.device))
    world = distributed.world_size()
    global_batch = t.batch_size * world  # every rank trains on its slice of one global batch
    if world > 1 and r.backend.name == "auto":
        raise InputError(
            "backend.name=auto times backends in one process; under torchrun choose "
            "backend.name=ort or torch"
        )
    runtime.seed_everything(t.seed)
    if t.deterministic:
        runtime.make_deterministic()
    task = tasks.get(r.task.name, r.task)
    # backend.name=auto is resolved by a short measured probe once the data is ready (below)
    backend_name: str = r.backend.name
    backend_extra: dict[str, Any] = {}
    log.info("device: %s (%s), %d threads", rt.device, rt.reason, rt.threads)

    # ---- data and tokenizer (all input errors surface here, before any training)
    raw = data.load_splits(loaded, task)
    tok_dir = run_dir / "tokenizer"
    if not distributed.is_main():  # DDP: rank 0 trains and saves the tokenizer, the others load it
        distributed.barrier()
    tokenizer = models.load_tokenizer(loaded, saved_dir=tok_dir if tok_dir.exists() else None)
    if tokenizer is None:
        texts = (
            task.texts(raw.train, r.data)
            if hasattr(task, "texts")
            else [str(row[r.data.text_column]) for row in raw.train]
        )
        tokenizer = models.train_tokenizer(texts, r.model.tokenizer.train)
        log.info("trained a %s tokenizer: %d tokens", r.model.tokenizer.train.kind, len(tokenizer))
    if not tok_dir.exists():
        tokenizer.save_pretrained(tok_dir)
    if distributed.is_main():
        distributed.barrier()  # the saved tokenizer is there for the other ranks
    labels = (
        task.label_names(raw.train, r.data)
        if hasattr(task, "label_names")
        else data.label_names(raw.train, r.data)
        if task.needs_labels
        else None
    )
    label2id = {name: i for i, name in enumerate(labels)} if labels else None
    train_enc, eval_enc = data.encode_splits(task, raw, tokenizer, r.data, label2id)
    if data.batches_per_epoch(len(train_enc), global_batch) == 0:
        raise InputError(
            f"data.train: {len(train_enc)} examples make no batch of "
            f"training.batch_size={t.batch_size}" + (f" x {world} processes" if world > 1 else "")
        )

    if backend_name == "auto":  # time a few steps of each backend, keep the faster
        from ortft.backends import auto as probe

        backend_name, backend_extra["probe"] = probe.choose(
            loaded, task, tokenizer, labels, train_enc, rt.device, build_optimizer
        )
        backend_extra["requested"] = "auto"
    backend = backends.get(backend_name, r.backend)

    # ---- model, backend, optimizer
    model = models.build_model(
        loaded, task.auto_class, tokenizer, labels, attn=backend.attn_implementation
    )
    if (
        r.hardware.gradient_checkpointing
    ):  # torch backend only (recipe check): recompute in backward
        model.gradient_checkpointing_enable()  # type: ignore[operator]
        log.info("gradient checkpointing: activations are recomputed in the backward")
    if r.adapter is not None:  # LoRA: the base is frozen, only adapter (+ head) weights train
        model = models.apply_adapter(model, r.adapter)
        log.info(
            "adapter: lora r=%d alpha=%g; %d of %d parameters train",
            r.adapter.rank,
            r.adapter.alpha,
            models.count_parameters(model, trainable=True),
            models.count_parameters(model),
        )
    if r.backend.trainable:  # the rest of the model is frozen (no gradient, not in the optimizer)
        models.freeze(model, r.backend.trainable)
        log.info(
            "backend.trainable: %d of %d parameters train",
            models.count_parameters(model, trainable=True),
            models.count_parameters(model),
        )
    module = models.TaskModule(model, is_decoder=getattr(task, "is_decoder", False), task=task).to(
        rt.device
    )
    log.info("%s", models.model_log_line(model, backend.attn_implementation))
    if backend.name == "ort":
        log.info(
            "backend: ort (ORTModule); eager attention, since ORTModule cannot build "
            "gradients for sdpa attention"
        )
    steps = total_steps(r, len(train_enc), world)
    optimizer = build_optimizer([p for p in module.parameters() if p.requires_grad], r, rt.device)
    from transformers import get_scheduler

    warmup = t.warmup_steps or int(t.warmup_ratio * steps)
    scheduler = get_scheduler(
        t.scheduler, optimizer, num_warmup_steps=warmup, num_training_steps=steps
    )
    state = checkpoint.TrainState()
    if resume_from is not None:
        ck = checkpoint.load(resume_from, module.model)
        optimizer.load_state_dict(ck.optimizer)
        scheduler.load_state_dict(ck.scheduler)
        checkpoint.set_rng_state(ck.rng)
        state = ck.state
        log.info("resuming from %s (step %d)", resume_from, state.step)
    wrapped = backend.wrap(module, run_dir)  # after loading weights: ORT shares these tensors
    wrapped.train()
    engine = None  # DeepSpeed's engine, when the recipe has a deepspeed section
    if r.deepspeed is not None:  # ZeRO 1/2 around ORTModule; the engine does DDP's job too
        from ortft.backends import deepspeed as zero

        engine = zero.start(wrapped, optimizer, scheduler, r, loaded.base_dir, world)
        forward: torch.nn.Module = engine
    else:
        forward = distributed.wrap(wrapped, rt.device)  # DDP around ORTModule (never the reverse)
    # DeepSpeed runs fp16/bf16 by casting the model itself; otherwise autocast around the forward
    amp_dtype = "fp32" if engine is not None else r.precision.dtype
    # fp16: loss scaling; for fp32/bf16 the scaler is disabled and each call below is a no-op
    scaler = torch.amp.GradScaler(rt.device.type, enabled=amp_dtype == "fp16")

    recipe_yaml = dump(r, base_dir=loaded.base_dir)
    metrics_log = (
        Tracker(
            run_dir,
            r.logging,  # metrics.jsonl (+ TensorBoard, plot)
            truncate_after_step=state.step if resume_from else None,
        )
        if distributed.is_main()
        else _NoTracker()
    )
    summary: dict[str, Any] = {
        "format_version": report.FORMAT_VERSION,
        "status": "running",
        "error": None,
        "task": task.name,
        "max_steps": steps,
        "parameters": models.count_parameters(module.model),
        "trainable_parameters": models.count_parameters(module.model, trainable=True),
        "provenance": {
            **report.provenance(loaded.path, loaded.sha256),
            "device": str(rt.device),
            "threads": rt.threads,
        },
        "paths": {
            "run_dir": str(run_dir),
            "final": None,
            "recipe": str(loaded.path.resolve()) if loaded.path else None,
            "onnx": None,
            "checkpoints": [],
            "last_checkpoint": str(resume_from) if resume_from else None,
        },
        "export": None,
        "resumed_from": str(resume_from) if resume_from else None,
        "precision": {"dtype": r.precision.dtype, "skipped_steps": 0},  # fp16 overflow steps
        "distributed": distributed.summary(),
    }
    per_epoch = data.batches_per_epoch(len(train_enc), global_batch)
    accum = t.gradient_accumulation_steps
    # the same seeded order in every process, cut into global batches (DDP: shard() below)
    batches = data.train_batches(
        train_enc, global_batch, t.seed, r.data.shuffle, start_micro=state.micro_step
    )
    params = [p for p in module.parameters() if p.requires_grad]
    collate = getattr(task, "collate", None)
    progress = Progress(total=steps, start=state.step)
    last_ckpt = resume_from
    stop_reason: str | None = None  # "max_time" when the wall-clock budget ended the run
    selector = Selector(r)  # early stopping, and the best eval for checkpoint.final=best
    # throughput over the steps after this process's first (which includes ORT's export)
    steady: dict[str, float] = {"time": 0.0, "samples": 0, "tokens": 0, "first_step_s": 0.0}

    def save_checkpoint() -> Path:
        nonlocal last_ckpt
        if engine is not None:  # ZeRO partitions the optimizer state over the ranks
            log.warning(
                "no checkpoint at step %d: DeepSpeed runs write no resumable checkpoints yet",
                state.step,
            )
        elif distributed.is_main():  # one writer; every rank resumes from the same folder
            last_ckpt = checkpoint.save(
                run_dir,
                state,
                module.model,
                optimizer,
                scheduler,
                recipe_yaml,
                r.checkpoint.keep_last,
            )
            summary["paths"]["last_checkpoint"] = str(last_ckpt)
        return last_ckpt  # type: ignore[return-value]

    def finish(status: str, error: str | None = None, write: bool = True) -> dict[str, Any]:
        metrics: dict[str, Any] = {"train_loss": state.last_train_loss}
        # final: best -> the metrics of the eval final/ holds, else the last eval's
        metrics.update(
            selector.final_eval or {f"eval_{k}": v for k, v in state.eval_metrics.items()}
        )
        summary.update(
            {
                "status": status,
                "error": error,
                "backend": {**backend.report().as_dict(), **backend_extra},
                "steps": state.step,
                "epochs": state.micro_step / per_epoch,
                "samples": state.samples,
                "tokens": state.tokens,
                "metrics": metrics,
                "throughput": report.throughput(steady),
                "train_time_s": state.train_time_s,
                "wall_time_s": time.time() - started,
            }
        )
        summary["paths"]["checkpoints"] = [str(p) for p in checkpoint.list_checkpoints(run_dir)]
        summary.update(selector.report(state, stop_reason))
        summary["provenance"]["finished_at"] = report.utc_now()
        if write and distributed.is_main():
            metrics_log.close()  # flush TensorBoard, draw curves.png
            try:
                report.write_json_atomic(run_dir / "summary.json", summary)
            except OSError as err:  # e.g. disk full: keep the run's own error, not this one
                if status == "completed":
                    raise RunError(
                        f"could not write {run_dir / 'summary.json'}: {err.strerror or err}"
                    ) from err
                log.warning("could not write summary.json: %s", err)
        return summary

    # ---- the loop
    signals = _Signals()
    try:
        with signals, progress:
            window_t, window_samples, window_tokens = 0.0, 0, 0
            first_step = True
            while state.step < steps:
                t0 = time.perf_counter()
                loss_sum = torch.zeros((), device=rt.device)
                step_tokens = 0
                for _ in range(accum):
                    epoch, batch = next(batches)
                    if collate is not None:  # e.g. masked-lm: this epoch's masking of these rows
                        batch = collate(batch, epoch, t.seed)
                    step_tokens += int(batch["attention_mask"].sum())  # of the global batch
                    batch = distributed.shard(batch)  # DDP: this rank's rows; else the batch
                    inputs = _to_device(batch, rt.device)
                    with runtime.autocast(amp_dtype, rt.device):  # disabled for fp32
                        loss, _ = forward(**inputs)
                    if engine is not None:  # DeepSpeed scales, accumulates and reduces gradients
                        engine.backward(loss)
                        engine.step()  # clip + optimizer + scheduler at the accumulation boundary only
                    else:
                        scaler.scale(
                            loss / accum
                        ).backward()  # DDP all-reduces (averages) gradients here
                    backend.after_step(wrapped)
                    loss_sum += loss.detach().float()
                    state.micro_step += 1
                    state.epoch = epoch
                if engine is None:
                    applied = _optimizer_step(optimizer, scheduler, scaler, params, t.max_grad_norm)
                else:  # DeepSpeed stepped in engine.step() above
                    applied = engine.was_step_applied()
                summary["precision"]["skipped_steps"] += not applied  # fp16 overflow: not an error
                state.step += 1
                # the one CPU-GPU sync per step; DDP: the mean over ranks (= the global batch's loss)
                loss_value = float(distributed.all_reduce_mean(loss_sum)) / accum
                dt = time.perf_counter() - t0
                state.train_time_s += dt
                window_t += dt
                state.samples += global_batch * accum
                state.tokens += step_tokens
                window_samples += global_batch * accum
                window_tokens += step_tokens
                if first_step:  # holds ORT's export and graph build: reported apart
                    steady["first_step_s"] = dt
                    first_step = False
                else:
                    steady["time"] += dt
                    steady["samples"] += global_batch * accum
                    steady["tokens"] += step_tokens
                if not math.isfinite(loss_value):
                    where = f"; last good checkpoint: {last_ckpt}" if last_ckpt else ""
                    raise RunError(f"loss is {loss_value} at step {state.step}{where}")
                state.last_train_loss = loss_value
                progress.update(state.step, loss=loss_value)
                if state.step % t.log_every == 0 or state.step == steps:
                    row = {
                        "kind": "train",
                        "step": state.step,
                        "epoch": state.micro_step / per_epoch,
                        "loss": loss_value,
                        "lr": scheduler.get_last_lr()[0],
                        "samples_per_s": window_samples / window_t,
                        "tokens_per_s": window_tokens / window_t,
                        "step_time_s": round(dt, 6),  # this step alone (ortft bench reads it)
                        "time_s": round(time.time() - started, 3),
                    }
                    metrics_log.write(row)
                    progress.log(
                        f"step {state.step}/{steps}  loss {loss_value:.4f}  "
                        f"lr {row['lr']:.2e}  {row['samples_per_s']:.1f} samples/s"
                    )
                    window_t, window_samples, window_tokens = 0.0, 0, 0
                if eval_enc is not None and (
                    (t.eval_every and state.step % t.eval_every == 0) or state.step == steps
                ):
                    state.eval_metrics = evaluate(
                        wrapped,
                        eval_enc,
                        task,
                        t.batch_size,
                        rt.device,
                        t.seed,
                        module.model,
                        tokenizer,
                    )
                    metrics_log.write(
                        {
                            "kind": "eval",
                            "step": state.step,
                            "epoch": state.micro_step / per_epoch,
                            **state.eval_metrics,
                        }
                    )
                    progress.eval(state.eval_metrics)
                    if selector.observe(state) and distributed.is_main():  # a new best: best/
                        save_best(run_dir, module.model, state)
                    if on_eval is not None:  # ortft hpo: report the eval, maybe prune the trial
                        on_eval(state.step, state.eval_metrics)
                if r.checkpoint.save_every and state.step % r.checkpoint.save_every == 0:
                    save_checkpoint()
                if selector.should_stop(state):  # early stopping: a normal, completed end
                    stop_reason = "early_stopping"
                    progress.log(selector.stop_message(state))
                    break
                # DDP: every rank must stop at the same step, so these flags are OR-ed over ranks
                out_of_time, signalled = distributed.any_rank(
                    bool(t.max_time and time.time() - started >= t.max_time),
                    signals.received is not None,
                )
                if out_of_time:
                    # the CI slot's budget: stop cleanly, resumable, final/ still written
                    stop_reason = "max_time"
                    progress.log(
                        f"training.max_time ({t.max_time:g}s) reached at step {state.step}"
                    )
                    save_checkpoint()
                    break
                if signalled:
                    sig = signals.received or signal.SIGTERM  # another rank got it
                    path = save_checkpoint()
                    finish("interrupted", f"stopped by signal {sig} at step {state.step}")
                    # the overrides too (a resume must see the same recipe), minus resume=never
                    again = [o for o in loaded.overrides if not o.startswith("checkpoint.resume=")]
                    cmd = shlex.join(
                        [
                            "ortft",
                            "train",
                            str(loaded.path or "RECIPE"),
                            *again,
                            "--output-dir",
                            str(run_dir),
                        ]
                    )
                    raise Interrupted(
                        f"interrupted at step {state.step}; checkpoint {path}; resume with: {cmd}",
                        sig,
                    )
    except OrtftError as err:
        if summary["status"] == "running":
            finish(getattr(err, "run_status", "failed"), str(err))
        raise
    except KeyboardInterrupt:
        # a second signal (or Ctrl-C outside our handler): no checkpoint, exit code by signal
        signum = signals.received if signals.received is not None else signal.SIGINT
        finish("interrupted", f"stopped at once by a second signal at step {state.step}")
        last = f"; last checkpoint: {last_ckpt}" if last_ckpt else ""
        raise Interrupted(f"stopped at once at step {state.step}{last}", signum) from None
    except Exception as err:
        finish("failed", f"{type(err).__name__}: {err}")
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        hint = ""
        if backend.name == "ort" and type(err).__module__.startswith("onnxruntime"):
            hint = (
                "; ONNX Runtime could not run this model: try backend.name=torch, or "
                "backend.allow_fallback=true to fall back to PyTorch (recorded in the summary)"
            )
        raise RunError(
            f"training failed at step {state.step}: {type(err).__name__}: {first[:300]}{hint}"
        ) from err

    # ---- DDP: the collectives are over; rank 0 alone writes final/, the export and the summary
    distributed.teardown()
    if not distributed.is_main():
        return summary

    # ---- final model, export, gates, summary
    selector.load_final(run_dir, module.model, state)  # final: best -> the best eval's weights
    final_dir = _write_final(run_dir, module.model, tokenizer, recipe_yaml)
    summary["paths"]["final"] = str(final_dir)
    summary["stop_reason"] = stop_reason
    gate_list = [gates.parse(g) for g in [*r.gates, *(extra_gates or [])]]
    skip = getattr(task, "export_skip", None)
    if r.export.enabled and skip:  # a task the exporter cannot write: say so, do not fail
        log.info("ONNX export skipped for %s: %s", task.name, skip)
        summary["export"] = {"skipped": skip}
    elif r.export.enabled:
        from ortft.export import exporter as export

        onnx_dir = run_dir / "onnx"
        # a LoRA model is exported merged: the adapter folded into the base weights
        exp = export.export_model(
            models.merged_copy(module.model),
            tokenizer,
            task.name,
            onnx_dir,
            opset=r.export.opset,
            tolerance=r.export.tolerance,
            samples=eval_enc or train_enc,
        )
        summary["export"] = exp
        summary["paths"]["onnx"] = exp["dir"]  # <run>/onnx.failed when a check failed
        # the parity check is a gate like any other: recorded, reported, exit 3 on failure
        gate_list.append(gates.Gate("export.max_abs_diff", "<=", r.export.tolerance))
    results = gates.check(gate_list, finish("completed", write=False))
    summary["gates"] = gates.as_dicts(results)
    summary = finish("stopped" if stop_reason == "max_time" else "completed")
    (final_dir / "README.md").write_text(report.model_card(summary, r))
    report.write_json_atomic(final_dir / "summary.json", summary)
    b = summary["backend"]
    log.info(
        "done: %d steps, backend %s%s, %d ORT export(s), %.1f samples/s",
        state.step,
        b["used"],
        " (FALLBACK)" if b["fallback"] else "",
        b["ort_exports"],
        summary["throughput"]["samples_per_s"],
    )
    _raise_failed_gates(results, summary)
    return summary


def _optimizer_step(
    optimizer: Any,
    scheduler: Any,
    scaler: torch.amp.GradScaler,
    params: list[torch.nn.Parameter],
    max_grad_norm: float | None,
) -> bool:
    """Clip, step, schedule, zero the gradients; False when fp16 loss scaling skipped the step."""
    scaler.unscale_(optimizer)  # fp16: clip the true gradients, not the scaled ones
    if max_grad_norm:
        torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    scale = scaler.get_scale()
    scaler.step(optimizer)  # fp16: skipped when a gradient overflowed (inf/nan)
    scaler.update()
    applied = scaler.get_scale() >= scale  # the scale shrinks only after a skipped step
    if applied:
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return applied


class _NoTracker:
    """Ranks other than 0 under torchrun write no metrics."""

    def write(self, row: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass


def _raise_failed_gates(results: list[gates.GateResult], summary: dict[str, Any]) -> None:
    """One line per gate on stderr; GateError (exit 3) if any failed."""
    for res in results:
        (log.info if res.passed else log.error)("%s", res.line())
    failed = [res for res in results if not res.passed]
    if failed:
        raise GateError(
            f"{len(failed)} of {len(results)} quality gate(s) failed: "
            + ", ".join(res.gate for res in failed),
            summary=summary,
        )


def _write_final(run_dir: Path, model: torch.nn.Module, tokenizer: Any, recipe_yaml: str) -> Path:
    """final/: a Hugging Face model folder + tokenizer + recipe, swapped in atomically.

    A LoRA run's final/ holds the base model (frozen weights, trained head) and, in
    final/adapter/, the adapter in PEFT's format; `ortft export --merge-adapters` merges them.
    """
    final = run_dir / "final"
    tmp = run_dir / ".final.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    if models.is_adapted(model):
        import copy

        copy.deepcopy(model).unload().save_pretrained(tmp)
        model.save_pretrained(tmp / "adapter")
    else:
        model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / "recipe.yaml").write_text(recipe_yaml)
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    return final
