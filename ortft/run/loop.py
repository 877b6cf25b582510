"""The training loop, read top to bottom: batches -> engine step -> log -> eval -> save -> stop rules.

Torch-free. The engine (``ortft.backends``) runs each optimizer step and each eval batch; this
module decides what happens around them and in which order, the same for every backend.
"""

from __future__ import annotations

import math
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ortft.checkpoint.store import TrainState, checkpoint_name
from ortft.core.errors import RunError
from ortft.core.progress import Progress
from ortft.data import batches
from ortft.data.batches import Padding  # the Loop's own `batches` field hides the module
from ortft.tasks import Encoded, Task, protocols, traits

if TYPE_CHECKING:
    from ortft.backends import Engine
    from ortft.recipe.schema import TrainingSection
    from ortft.run.early_stopping import Selector
    from ortft.run.tracking import Sink


class Signals:
    """First SIGINT/SIGTERM: finish the step, checkpoint, stop. Second: stop at once."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._old: dict[int, Any] = {}

    def __enter__(self) -> Signals:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        import logging

        if self.received is not None:
            raise KeyboardInterrupt
        self.received = signum
        logging.getLogger("ortft").warning(
            "signal %d: finishing this step, then saving a checkpoint (again to abort)", signum
        )

    def __exit__(self, *exc: Any) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


@dataclass
class Meter:
    """Samples and tokens per second: over the logging window, and over the steady state
    (every step after this process's first, which holds ORT's export and session build)."""

    first_step_s: float = 0.0
    steady: dict[str, float] = field(
        default_factory=lambda: {"time": 0.0, "samples": 0, "tokens": 0, "first_step_s": 0.0}
    )
    window: list[float] = field(default_factory=lambda: [0.0, 0, 0])  # time, samples, tokens
    steps: int = 0

    def add(self, dt: float, samples: int, tokens: int) -> None:
        self.window = [self.window[0] + dt, self.window[1] + samples, self.window[2] + tokens]
        self.steps += 1
        if self.steps == 1:
            self.steady["first_step_s"] = dt
        else:
            self.steady["time"] += dt
            self.steady["samples"] += samples
            self.steady["tokens"] += tokens

    def take_window(self) -> tuple[float, float]:
        """(samples/s, tokens/s) since the last logged row; starts a new window."""
        t, samples, tokens = self.window
        self.window = [0.0, 0, 0]
        return samples / t, tokens / t


@dataclass
class Loop:
    """What one run's loop works with (built by ``lifecycle.run``)."""

    engine: Engine
    task: Task
    training: TrainingSection
    steps: int  # optimizer steps of the whole run
    global_batch: int  # rows per micro-batch over all processes
    per_epoch: int  # micro-batches per epoch (0: a stream, data.streaming)
    batches: Iterator[tuple[int, dict[str, np.ndarray]]]
    eval_data: Encoded | None
    tokenizer: Any  # the run's tokenizer or processor (a transformers object)
    tracker: Sink
    progress: Progress
    selector: Selector
    signals: Signals
    save: Callable[[TrainState], Path | None]  # write a checkpoint (the lifecycle records it)
    run_dir: Path
    started: float  # wall clock at the run's start
    on_eval: Callable[[int, dict[str, float]], None] | None = None
    save_every: int | None = None  # checkpoint.save_every
    padding: Padding = field(default_factory=Padding)  # data.padding
    shapes: set[tuple[int, ...]] = field(default_factory=set)  # distinct batch shapes trained
    meter: Meter = field(default_factory=Meter)
    last_checkpoint: Path | None = None


def train(loop: Loop, state: TrainState) -> str | None:
    """Step until ``loop.steps``; the stop reason: None (done), "early_stopping", "max_time",
    or "signal" (the lifecycle checkpoints and reports the interruption)."""
    t = loop.training
    while state.step < loop.steps:
        t0 = time.perf_counter()
        micro, tokens, shapes = [], 0, {"padded_tokens": 0, "batch_lengths": [], "tokens_sq": 0}
        for _ in range(t.gradient_accumulation_steps):
            epoch, batch = next(loop.batches)
            batch = loop.task.collate(batch, epoch, t.seed)  # masked-lm: this epoch's masking
            batch = loop.task.cut(batch, loop.padding)  # data.padding
            mask = _mask(batch, loop.task.main_input)
            tokens += int(mask.sum())  # of the global batch: real tokens
            _add_shape(shapes, mask)
            state.padded_tokens += mask.size  # real + padding
            loop.shapes.add(batch[loop.task.main_input].shape)
            micro.append(batch)
            state.micro_step += 1
            state.epoch = epoch
        result = loop.engine.train_step(micro)
        state.step += 1
        dt = time.perf_counter() - t0
        samples = loop.global_batch * len(micro)
        state.train_time_s += dt
        state.samples += samples
        state.tokens += tokens
        loop.meter.add(dt, samples, tokens)
        if not math.isfinite(result.loss):
            where = (
                f"; last good checkpoint: {loop.last_checkpoint}" if loop.last_checkpoint else ""
            )
            raise RunError(f"loss is {result.loss} at step {state.step}{where}")
        state.last_train_loss = result.loss
        loop.progress.update(state.step, loss=result.loss)
        if state.step % t.log_every == 0 or state.step == loop.steps:
            _log_row(loop, state, result.lr, dt, {**result.metrics, "tokens": tokens, **shapes})
        if loop.eval_data is not None and (
            (t.eval_every and state.step % t.eval_every == 0) or state.step == loop.steps
        ):
            _eval(loop, state)
        if isinstance(loop.task, protocols.DrawsValidation):  # text-to-image's prompts
            _draw_validation(loop, loop.task, state)
        if loop.save_every and state.step % loop.save_every == 0:
            loop.save(state)
        if loop.selector.should_stop(state):  # early stopping: a normal, completed end
            loop.progress.log(loop.selector.stop_message(state))
            return "early_stopping"
        # under torchrun every process must stop at the same step: the flags are OR-ed
        out_of_time, signalled = loop.engine.any_rank(
            bool(t.max_time and time.time() - loop.started >= t.max_time),
            loop.signals.received is not None,
        )
        if out_of_time:  # the CI slot's budget: stop cleanly, resumable, final/ still written
            loop.progress.log(f"training.max_time ({t.max_time:g}s) reached at step {state.step}")
            loop.save(state)
            return "max_time"
        if signalled:
            return "signal"
    return None


def _draw_validation(loop: Loop, task: protocols.DrawsValidation, state: TrainState) -> None:
    """A family that draws as it trains: its images every ``validation_every`` steps and at
    the last, in ``<run>/validation/step-NNNNNN/``."""
    every = task.validation_every
    if every and (state.step % every == 0 or state.step == loop.steps):
        folder = loop.run_dir / "validation" / checkpoint_name(state.step)
        drawn = task.draw_validation(folder, loop.training.seed)
        loop.progress.log(f"validation: {drawn} image(s) in {folder}")


def _epochs(loop: Loop, state: TrainState) -> float:
    """Epochs trained so far; a stream (data.streaming) has no length: the epoch number."""
    return state.micro_step / loop.per_epoch if loop.per_epoch else float(state.epoch)


def _mask(batch: dict[str, np.ndarray], model_input: str) -> np.ndarray:
    """Which positions are real: the attention mask; a batch of images or clips has none, and
    counts one "token" per row of its model input (``Task.main_input``), so tokens/s is
    images/s or clips/s there, and padding is 0."""
    mask = batch.get("attention_mask")
    return mask if mask is not None else np.ones((len(batch[model_input]), 1), dtype=np.int64)


def _add_shape(shapes: dict[str, Any], mask: np.ndarray) -> None:
    """This micro-batch's shape, for the metrics row: what ``ortft bench`` counts FLOPs from."""
    shapes["padded_tokens"] += mask.size  # rows × batch length: what the hardware ran
    shapes["batch_lengths"].append(mask.shape[1])
    shapes["tokens_sq"] += int((mask.sum(axis=1, dtype=np.int64) ** 2).sum())  # attention: Σ l²


def _log_row(
    loop: Loop, state: TrainState, lr: float, dt: float, step_shapes: dict[str, Any]
) -> None:
    samples_per_s, tokens_per_s = loop.meter.take_window()
    row = {
        "kind": "train",
        "step": state.step,
        "epoch": _epochs(loop, state),
        "loss": state.last_train_loss,
        "lr": lr,
        "samples_per_s": samples_per_s,
        "tokens_per_s": tokens_per_s,
        "step_time_s": round(dt, 6),  # this step alone (ortft bench reads it)
        # this step alone too: a ScoresOutside task's metrics (preference: the rewards), real
        # tokens, padded tokens, each micro-batch's length, Σ row length²
        **step_shapes,
        "time_s": round(time.time() - loop.started, 3),
    }
    loop.tracker.write(row)
    loop.progress.log(
        f"step {state.step}/{loop.steps}  loss {state.last_train_loss:.4f}  "
        f"lr {lr:.2e}  {samples_per_s:.1f} samples/s"
    )


def _eval(loop: Loop, state: TrainState) -> None:
    t = loop.training
    state.eval_metrics = evaluate(
        loop.engine, loop.eval_data, loop.task, t.batch_size, t.seed, loop.tokenizer, loop.padding
    )
    epoch = _epochs(loop, state)
    loop.tracker.write({"kind": "eval", "step": state.step, "epoch": epoch, **state.eval_metrics})
    loop.progress.eval(state.eval_metrics)
    if loop.selector.observe(state):  # a new best: best/
        loop.engine.save_best(loop.run_dir, state)
    if loop.on_eval is not None:  # ortft hpo: report the eval, maybe prune the trial
        loop.on_eval(state.step, state.eval_metrics)


def evaluate(
    engine: Any,
    encoded: Any,
    task: Any,
    batch_size: int,
    seed: int,
    tokenizer: Any,
    padding: batches.Padding | None = None,
) -> dict[str, float]:
    """Loss over every eval row (label-weighted) plus the task's metrics; a task whose metrics
    need generation gets them from the engine (``extra_metrics``)."""
    engine.eval_mode(True)
    total, weight, logits_all, labels_all = 0.0, 0, [], []
    try:
        for batch in batches.eval_batches(encoded, batch_size):
            batch = task.collate(batch, None, seed)  # None: the task's fixed eval variant
            batch = task.cut(batch, padding or batches.Padding())
            n = task.counted(batch)  # real labels (a padded eval copy has none)
            loss, logits = engine.eval_batch(batch)
            total += loss * n
            weight += n
            if traits.needs_logits(task):
                logits_all.append(logits)
                labels_all.append(protocols.metric_labels(task, batch, int(batch["_valid"])))
    finally:
        engine.eval_mode(False)
    metrics = task.metrics(total / max(weight, 1), logits_all, labels_all)
    metrics.update(engine.extra_metrics(task, tokenizer, encoded))
    return metrics
