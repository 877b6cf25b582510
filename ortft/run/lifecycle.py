"""One training run, every backend, read top to bottom.

run(): run directory and resume -> engine.start (device, seeds, process group) -> data and
tokenizer -> engine.prepare (model, optimizer, resumed state) -> loop.train (steps, logs, evals,
checkpoints, stop rules) -> final/ -> ONNX export -> gates -> summary.json.

Torch-free: whatever needs a framework is the engine's (``ortft.backends``), so the pure-ORT
on-device backend runs this same lifecycle without PyTorch.

Over 450 lines: the whole run, read top to bottom in one module, by design.
"""

from __future__ import annotations

import logging
import math
import signal
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from ortft import backends, tasks
from ortft.checkpoint import store as checkpoint
from ortft.core import devenv, fsutil
from ortft.core.errors import InputError, Interrupted, OrtftError, RunError, first_line
from ortft.core.progress import Progress
from ortft.data import batches, rows, splits, streaming
from ortft.env import unused
from ortft.recipe.backends import check_installed
from ortft.recipe.io import LoadedRecipe, dump
from ortft.run import final, gates, loop, provenance, report, rundir, trackers, tracking
from ortft.run.early_stopping import Selector
from ortft.run.summary import Provenance, RunPaths, RunSummary
from ortft.run.tracking import Sink, Tracker
from ortft.tasks import protocols

log = logging.getLogger("ortft")

resolve_run_dir = rundir.resolve  # the CLI asks where a run writes before it starts


def total_steps(training: Any, n_train: int, world: int = 1) -> int:
    """training.max_steps, else the optimizer steps of training.epochs (1 by default)."""
    if training.max_steps:
        return training.max_steps
    global_batch = training.batch_size * world
    per_epoch = (
        batches.batches_per_epoch(n_train, global_batch) / training.gradient_accumulation_steps
    )
    return max(1, math.ceil((training.epochs or 1.0) * per_epoch))


def run(
    loaded: LoadedRecipe,
    output_dir: Path | None = None,
    extra_gates: list[str] | None = None,
    on_eval: Callable[[int, dict[str, float]], None] | None = None,
    tracker_parent: dict[str, str] | None = None,
) -> RunSummary:
    """Train ``loaded``; ``on_eval(step, metrics)`` is called after every eval (ortft hpo's hook:
    it may raise ``errors.Stopped`` to end the run, recorded as status "pruned");
    ``tracker_parent``: ortft hpo's study run, whose child this run's tracker runs are."""
    r = loaded.recipe
    check_installed(r)  # backend.name=ort without ORT training: exit 2 before any work
    run_dir = rundir.resolve(loaded, output_dir)
    previous = RunSummary.read(run_dir / "summary.json")  # a foreign format_version: exit 2
    if previous and previous.status == "completed" and r.checkpoint.resume == "auto":
        return _already_finished(previous, loaded, run_dir, extra_gates)
    with unused.without_deepspeed(needed=r.deepspeed is not None):
        engine = backends.create(loaded)
        rundir.make(run_dir)
        with rundir.lock(run_dir):  # a second run on this directory: exit 2, naming its pid
            resume_from = rundir.find_resume(loaded, run_dir, engine.checkpoint_problem)
            fsutil.remove_stale(run_dir, ".*.tmp-*")  # what a kill -9 left of a save
            run_ = _Run(loaded, run_dir, engine, resume_from, extra_gates, on_eval)
            run_.tracker_parent = tracker_parent or {}
            return run_.execute()


def _already_finished(
    previous: RunSummary, loaded: LoadedRecipe, run_dir: Path, extra_gates: list[str] | None
) -> RunSummary:
    log.info(
        "%s already holds a finished run; nothing to do (use another --output-dir to train again)",
        run_dir,
    )
    if previous.provenance.recipe_sha256 != loaded.sha256:
        log.warning("the recipe changed since that run finished")
    if extra_gates:  # a CI re-run still gets its verdict, from the recorded summary
        results = gates.check([gates.parse(g) for g in extra_gates], previous)
        previous.gates = [*previous.gates, *gates.as_dicts(results)]
        gates.raise_failed(results, previous)
    return previous


class _Run:
    """The state one run carries from its start to summary.json."""

    def __init__(self, loaded, run_dir, engine, resume_from, extra_gates, on_eval) -> None:
        self.loaded, self.recipe, self.run_dir = loaded, loaded.recipe, run_dir
        self.engine, self.resume_from = engine, resume_from
        self.extra_gates, self.on_eval = extra_gates or [], on_eval
        self.started = time.time()
        self.state = checkpoint.TrainState()
        self.stop_reason: str | None = None
        self.selector = Selector(self.recipe)
        self.loop: loop.Loop | None = None  # built once the data and the engine are ready
        self.tracker: Sink | None = None  # opened with the loop
        self.tracker_parent: dict[str, str] = {}
        self.at_max_length: int | None = 0
        self.data_report: dict[str, Any] = {}
        self.summary = RunSummary(
            task=self.recipe.task.name,
            provenance=Provenance.collect(loaded.path, loaded.sha256, device="", threads=0),
            paths=RunPaths(
                run_dir=str(run_dir),
                recipe=str(loaded.path.resolve()) if loaded.path else None,
                last_checkpoint=str(resume_from) if resume_from else None,
            ),
            resumed_from=str(resume_from) if resume_from else None,
        )

    def _start(self) -> Any:
        """``engine.start``: the device, threads and process group, logged and recorded."""
        started = self.engine.start(self.recipe)
        provenance = self.summary.provenance
        provenance.device, provenance.threads = started.device, started.threads
        provenance.heap = started.heap
        self.summary.distributed = started.distributed
        log.info("device: %s", started.describe())
        for name, value in provenance.developer_overrides.items():
            what = devenv.OVERRIDES[name]
            log.warning("developer override %s=%s: %s (in summary.json)", name, value, what)
        return started

    def _read_data(self, task: tasks.Task) -> tuple[Any, list[str] | None, Any, Any]:
        """The data and the tokenizer (or processor): (tokenizer, label names, the encoded
        train and eval splits). Every input error surfaces here, before any training."""
        r = self.recipe
        raw = splits.load_splits(r.data, self.loaded.base_dir, task, seed=r.training.seed)
        labels = rows.labels_of(task, raw.train, r.data)  # None for tasks without labels
        tokenizer = self.engine.tokenizer(self.loaded, self.run_dir, task, raw.train, labels)
        if isinstance(task, protocols.ReadsFiles):  # its collate runs the processor
            task.bind(tokenizer)
        label2id = {name: i for i, name in enumerate(labels)} if labels else None
        train, evals = splits.encode_splits(task, raw, tokenizer, r.data, label2id)
        if isinstance(task, protocols.ScoresReference):  # filled when the engine builds the model
            train, evals = task.with_reference(train, evals, r.data)
        if isinstance(task, protocols.ReportsData):  # files skipped and converted
            self.data_report = task.data_report(
                {"train": (raw.train, train), "eval": (raw.eval, evals)}
            )
        return tokenizer, labels, train, evals

    def execute(self) -> RunSummary:
        r, t = self.recipe, self.recipe.training
        tracking.check(r.logging, self.run_dir)  # a tracker not installed, a bad URI: exit 2 now
        started = self._start()
        task = tasks.get(r.task.name, r.task)
        tokenizer, labels, train, evals = self._read_data(task)
        global_batch = t.batch_size * started.world_size  # each rank trains on its slice
        stream = streaming.is_stream(train)  # data.streaming: no length, max_steps given
        make_batches: Any = (
            train.train_batches if stream else partial(batches.train_batches, train)  # type: ignore[attr-defined]
        )
        per_epoch = 0 if stream else batches.batches_per_epoch(len(train), global_batch)
        if per_epoch == 0 and not stream:
            world = f" x {started.world_size} processes" if started.world_size > 1 else ""
            raise InputError(
                f"data.train: {len(train)} examples make no batch of "
                f"training.batch_size={t.batch_size}{world}"
            )
        steps = t.max_steps if stream else total_steps(t, len(train), started.world_size)
        # rows that fill max_length: truncated there, or exactly that long (unknown in a stream)
        self.at_max_length = (
            None if stream else int((batches.lengths(train) >= r.data.max_length).sum())
        )
        # ---- the engine: model, optimizer, schedule, and a resumed run's state
        self.state = self.engine.prepare(
            self.loaded, task, tokenizer, labels, train, self.run_dir, self.resume_from, steps
        )
        if self.resume_from is not None:
            log.info("resuming from %s (step %d)", self.resume_from, self.state.step)
        self.summary.max_steps = steps
        self.summary.parameters, self.summary.trainable_parameters = self.engine.parameter_counts()
        self.recipe_yaml = dump(r, base_dir=self.loaded.base_dir)
        main = self.engine.is_main()
        # under DDP global rank 0 alone logs: one tracker run, every step once
        tracker = self._open_tracker() if main else _NoTracker()
        self.tracker = tracker
        self.loop = loop.Loop(
            engine=self.engine,
            task=task,
            training=t,
            steps=steps,
            global_batch=global_batch,
            per_epoch=per_epoch,
            eval_data=evals,
            tokenizer=tokenizer,
            tracker=tracker,
            # the same seeded order in every process, cut into global batches
            batches=make_batches(
                global_batch,
                t.seed,
                r.data.shuffle,
                start_micro=self.state.micro_step,
                group_by_length=r.data.group_by_length,
            ),
            padding=batches.Padding.of(r.data),
            progress=Progress(total=steps, start=self.state.step),
            selector=self.selector,
            signals=loop.Signals(),
            save=self._save,
            run_dir=self.run_dir,
            started=self.started,
            on_eval=self.on_eval,
            save_every=r.checkpoint.save_every,
            last_checkpoint=self.resume_from,
        )
        self._train()
        # ---- the collectives are over; rank 0 alone writes final/, the export and the summary
        self.engine.close(ok=True)
        if not main:
            return self.summary
        return self._finish_or_fail(task, tokenizer, evals or train)

    def _finish_or_fail(self, task: Any, tokenizer: Any, samples: Any) -> RunSummary:
        """``_finish_run``; when final/ or the export raises, summary.json and the tracker runs
        say so (an MLflow run was left RUNNING) and the error is one line. A gate fails after
        the run completed, so it passes through as it is."""
        try:
            return self._finish_run(task, tokenizer, samples)
        except (Exception, KeyboardInterrupt) as err:
            if self.summary.status != "running":
                raise
            message = f"after training: {type(err).__name__}: {first_line(err)}"
            interrupted = isinstance(err, KeyboardInterrupt | Interrupted)
            self.finish("interrupted" if interrupted else "failed", message)
            if interrupted or isinstance(err, OrtftError):
                raise
            last = self.loop.last_checkpoint if self.loop else None
            raise RunError(message + (f"; last checkpoint: {last}" if last else "")) from err

    @property
    def _loop(self) -> loop.Loop:
        """The loop, once built: what runs from the first step on needs it."""
        assert self.loop is not None, "the loop is built before training starts"
        return self.loop

    def _save(self, state: checkpoint.TrainState) -> Path | None:
        path = self.engine.save(
            self.run_dir, state, self.recipe_yaml, self.recipe.checkpoint.keep_last
        )
        if path is not None:
            self._loop.tracker.commit(
                state.step
            )  # MLflow and W&B get the rows the checkpoint holds
            self._loop.last_checkpoint = path
            self.summary.paths.last_checkpoint = str(path)
        return path

    def _train(self) -> None:
        """The loop, with every way out of it turned into a status, a summary and an error."""
        state, signals = self.state, self._loop.signals
        try:
            with signals, self._loop.progress:
                self.stop_reason = loop.train(self._loop, state)
                if self.stop_reason == "signal":
                    self.stop_reason = None
                    sig = signals.received or signal.SIGTERM  # another rank got it
                    path = self._save(state)
                    self.finish("interrupted", f"stopped by signal {sig} at step {state.step}")
                    cmd = rundir.resume_command(self.loaded, self.run_dir)
                    raise Interrupted(
                        f"interrupted at step {state.step}; checkpoint {path}; resume with: {cmd}",
                        sig,
                    )
        except OrtftError as err:
            if self.summary.status == "running":
                self.finish(getattr(err, "run_status", "failed"), str(err))
            raise
        except KeyboardInterrupt:
            # a second signal (or Ctrl-C outside our handler): no checkpoint, exit code by signal
            signum = signals.received if signals.received is not None else signal.SIGINT
            self.finish("interrupted", f"stopped at once by a second signal at step {state.step}")
            last = self._loop.last_checkpoint
            where = f"; last checkpoint: {last}" if last else ""
            raise Interrupted(f"stopped at once at step {state.step}{where}", signum) from None
        except Exception as err:
            self.finish("failed", f"{type(err).__name__}: {err}")
            hint = ""
            if self.engine.report().used == "ort" and type(err).__module__.startswith(
                "onnxruntime"
            ):
                hint = (
                    "; ONNX Runtime could not run this model: try backend.name=torch, or "
                    "backend.allow_fallback=true to fall back to PyTorch (recorded in the summary)"
                )
            raise RunError(
                f"training failed at step {state.step}: {type(err).__name__}: "
                f"{first_line(err)}{hint}"
            ) from err

    def _finish_run(self, task: Any, tokenizer: Any, samples: Any) -> RunSummary:
        """final/, the export, the gates, summary.json (rank 0 only)."""
        r, state, s = self.recipe, self.state, self.summary
        self.engine.select_final(self.selector, self.run_dir, state)  # final: best -> its weights
        final_dir = final.write(self.run_dir, self.engine.write_final, tokenizer, self.recipe_yaml)
        s.paths.final = str(final_dir)
        s.stop_reason = self.stop_reason
        gate_list = [gates.parse(g) for g in [*r.gates, *self.extra_gates]]
        s.export = self.engine.export(self.run_dir, final_dir, samples)
        checked = s.export is not None and "parity" in s.export
        if checked:
            s.paths.onnx = s.export["dir"]  # <run>/onnx.failed when a check failed
        if checked and r.export.required:
            # the parity check is a gate like any other: recorded, reported, exit 3 on failure
            gate_list.append(gates.Gate("export.max_abs_diff", "<=", r.export.tolerance))
        elif checked and s.export.get("failures"):
            log.warning(
                "export checks failed (export.required: false, so the run passes): %s",
                "; ".join(s.export["failures"]),
            )
        results = gates.check(gate_list, self.finish("completed", write=False))
        if checked and r.export.required:  # generation (decoders, seq2seq), image preprocess
            results += gates.export_checks(s.export)
        s.gates = gates.as_dicts(results)
        self.finish("stopped" if self.stop_reason == "max_time" else "completed")
        final.describe(final_dir, s, r)
        self._close_tracker(final_dir)
        b = s.backend
        assert b is not None, "finish() records the backend"
        log.info(
            "done: %d steps, backend %s%s, %d ORT export(s), %.1f samples/s",
            state.step,
            b.used,
            " (FALLBACK)" if b.fallback else "",
            b.ort_exports,
            s.throughput["samples_per_s"],
        )
        gates.raise_failed(results, s)
        return s

    def _open_tracker(self) -> Tracker:
        """metrics.jsonl and the trackers; a resume reopens the tracker runs its checkpoint names."""
        r, p = self.recipe, self.summary.provenance
        tags = {
            f"ortft.{k}": str(v) for k, v in p.to_dict().items() if k not in ("packages", "extra")
        }
        tags.update({"ortft.task": r.task.name, "ortft.backend": r.backend.name})
        return Tracker(
            self.run_dir,
            r.logging,
            self.state.step if self.resume_from else None,
            ids=self.state.trackers,
            parent=self.tracker_parent,
            tags=tags,
            params=trackers.flatten(r.model_dump(mode="json")),
        )

    def _close_tracker(self, final_dir: Path) -> None:
        """The trackers get summary.json, the model card and export.json, then end their runs;
        a failure there is one more warning, so summary.json is written again."""
        s = self.summary
        files = [self.run_dir / "summary.json", final_dir / "README.md"]
        if s.paths.onnx:
            files.append(Path(s.paths.onnx) / "export.json")
        tracker = self._loop.tracker
        before = len(tracker.warnings)
        tracker.close(s.status, files)
        if len(tracker.warnings) > before:
            s.extra["trackers"] = tracker.report()
            s.write(self.run_dir / "summary.json")

    def finish(self, status: str, error: str | None = None, write: bool = True) -> RunSummary:
        """Bring the summary up to date; write summary.json (rank 0) unless ``write`` is False."""
        s, state = self.summary, self.state
        metrics: dict[str, Any] = {"train_loss": state.last_train_loss}
        # final: best -> the metrics of the eval final/ holds, else the last eval's
        metrics.update(
            self.selector.final_eval or {f"eval_{k}": v for k, v in state.eval_metrics.items()}
        )
        per_epoch = self.loop.per_epoch if self.loop else 0
        meter = self.loop.meter if self.loop else loop.Meter()
        s.status, s.error = status, error
        s.backend = self.engine.report()
        s.precision = self.engine.precision()
        s.steps, s.samples, s.tokens = state.step, state.samples, state.tokens
        if self.loop:
            s.data = {
                "padding": self.loop.padding.mode,
                "padding_fraction": 1 - state.tokens / state.padded_tokens
                if state.padded_tokens
                else 0.0,
                "batch_shapes": len(self.loop.shapes),  # distinct, in this process
                "rows_at_max_length": self.at_max_length,
                "streaming": self.recipe.data.streaming,
                **self.data_report,  # the task's own (images: files skipped and converted)
            }
        s.epochs = state.micro_step / per_epoch if per_epoch else float(state.epoch)
        s.metrics, s.throughput = metrics, report.throughput(meter.steady)
        s.train_time_s, s.wall_time_s = state.train_time_s, time.time() - self.started
        s.paths.checkpoints = [str(p) for p in checkpoint.list_checkpoints(self.run_dir)]
        s.apply(self.selector.report(state, self.stop_reason))
        s.provenance.finished_at = provenance.utc_now()
        if write and self.engine.is_main():
            if self.tracker is not None and status not in ("completed", "stopped"):
                self.tracker.close(status)  # a finished run's closes after the model card
            if self.tracker is not None and self.tracker.report():
                s.extra["trackers"] = self.tracker.report()
            try:
                s.write(self.run_dir / "summary.json")
            except OSError as err:  # e.g. disk full: keep the run's own error, not this one
                if status == "completed":
                    raise RunError(
                        f"could not write {self.run_dir / 'summary.json'}: {err.strerror or err}"
                    ) from err
                log.warning("could not write summary.json: %s", err)
        return s


class _NoTracker:
    """Ranks other than 0 under torchrun write no metrics."""

    warnings: list[str] = []

    def write(self, row: dict[str, Any]) -> None:
        pass

    def commit(self, step: int) -> None:
        pass

    def close(self, status: str = "", artifacts: list[Path] | None = None) -> None:
        pass

    def report(self) -> dict[str, Any]:
        return {}
