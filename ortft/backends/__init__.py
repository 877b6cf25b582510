"""Engines: what runs the model's forward, backward and optimizer step. The loop sees only ``Engine``.

- ``torch``, ``ort``, ``auto`` (``torch/engine.py``): a PyTorch module engine — eager PyTorch
  (``torch/eager.py``), ORTModule (``ortmodule/``), or whichever a short probe finds faster
  (``torch/auto.py``); DDP, DeepSpeed and AMP live in ``torch/``.
- ``ort-ondevice`` (``ondevice/``): ONNX Runtime's on-device training API; no PyTorch in the loop.

This module holds the ``Engine`` protocol, the registry and what engines report (``report.py``).
Adding a backend is a new file with a class that follows ``Engine``, one line in ``REGISTRY``
(its engine factory and its process environment) and its recipe checks in
``ortft.recipe.backends``; ``register`` adds an engine from outside the package, e.g. a test's
toy engine. This module is torch-free: engines import their frameworks when they are created.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ortft.backends.report import BackendReport, Precision
from ortft.core.reports import ExportReport
from ortft.env import heap as process_heap

if TYPE_CHECKING:
    import numpy as np

    from ortft.checkpoint.store import TrainState
    from ortft.recipe.io import LoadedRecipe
    from ortft.recipe.schema import Recipe
    from ortft.tasks import Encoded, Task

__all__ = [
    "REGISTRY",
    "Backend",
    "BackendReport",
    "Engine",
    "Started",
    "StepResult",
    "create",
    "names",
    "process_env",
    "register",
]


@dataclass
class Started:
    """What ``Engine.start`` resolved: logged and recorded in summary.json."""

    device: str
    threads: int
    reason: str  # why this device ("auto: no CUDA GPU visible")
    world_size: int = 1  # processes under torchrun; the loop's global batch is batch_size x this
    distributed: dict[str, Any] = field(default_factory=lambda: {"world_size": 1})
    heap: str = process_heap.SYSTEM  # hardware.heap as applied (ortft.env.heap)

    def describe(self) -> str:
        """The run's log line: the device and why, its threads and its heap."""
        return f"{self.device} ({self.reason}), {self.threads} threads, heap {self.heap}"


@dataclass
class StepResult:
    loss: float  # the optimizer step's mean loss (over micro-batches and ranks)
    lr: float  # the learning rate this step used
    applied: bool = True  # False when fp16 loss scaling skipped the update (overflow)
    # a task that scores its loss outside the module (``ScoresOutside``): its metrics of this
    # step's rows (this process's), for the metrics row (preference: the rewards)
    metrics: dict[str, float] = field(default_factory=dict)


class FinalWeights(Protocol):
    """What ``Engine.select_final`` calls on the run's selector (``ortft.run.early_stopping``):
    it loads the best eval's weights into the engine's model."""

    def load_final(self, run_dir: Path, model: Any, state: TrainState) -> None: ...


class Engine(Protocol):
    name: str  # backend.name as requested ("auto" keeps that name; report() says what ran)

    def start(self, recipe: Recipe) -> Started:
        """Device, threads, seeds, determinism, process group: once, before any data work."""

    def is_main(self) -> bool:
        """The one process that logs and writes files (rank 0; always true in one process)."""

    def tokenizer(
        self, loaded: LoadedRecipe, run_dir: Path, task: Task, train_rows: list, labels: Any
    ) -> Any:
        """The tokenizer the run uses (loaded, trained, or the one that came with artifacts)."""

    def prepare(
        self,
        loaded: LoadedRecipe,
        task: Task,
        tokenizer: Any,
        labels: list[str] | None,
        train: Encoded,
        run_dir: Path,
        resume_from: Path | None,
        total_steps: int,
    ) -> TrainState:
        """Model, optimizer, schedule; a resumed run's weights, optimizer and RNG state."""

    def train_step(self, micro_batches: list[dict[str, np.ndarray]]) -> StepResult:
        """One optimizer step over ``micro_batches`` (global batches: the engine shards them)."""

    def eval_batch(self, batch: dict[str, np.ndarray]) -> tuple[float, np.ndarray | None]:
        """The mean loss and (when the task needs them) float32 logits of one eval batch."""

    def eval_mode(self, on: bool) -> None: ...

    def extra_metrics(self, task: Task, tokenizer: Any, encoded: Encoded) -> dict[str, float]:
        """Eval metrics that need more than logits (generation); {} when there are none."""

    def any_rank(self, *flags: bool) -> tuple[bool, ...]:
        """Each flag true if it is true in any process, so every process stops at the same step."""

    def save(
        self, run_dir: Path, state: TrainState, recipe_yaml: str, keep_last: int
    ) -> Path | None:
        """A resumable checkpoint ``step-NNNNNN/``; None when this configuration writes none."""

    def checkpoint_problem(self, path: Path) -> str | None:
        """Why ``path`` is not a checkpoint this engine resumes from (None: it is)."""

    def save_best(self, run_dir: Path, state: TrainState) -> None: ...

    def select_final(self, selector: FinalWeights, run_dir: Path, state: TrainState) -> None:
        """``checkpoint.final: best``: load the best eval's weights before final/ is written."""

    def write_final(self, folder: Path) -> None:
        """The trained model's files into ``folder`` (a temporary folder the loop swaps in)."""

    def export(self, run_dir: Path, final_dir: Path, samples: Encoded) -> ExportReport | None:
        """The ONNX export and its parity report (``summary.export``); None when disabled."""

    def parameter_counts(self) -> tuple[int, int]:
        """(all parameters, trainable parameters)."""

    def precision(self) -> Precision | None:
        """summary.precision (dtype, fp16 steps skipped); None where it does not apply."""

    def report(self) -> BackendReport: ...

    def close(self, ok: bool) -> None:
        """Release the engine (process group, sessions); ``ok``: the run ended normally."""


@dataclass(frozen=True)
class Backend:
    """One registry line: where the engine is and the environment its process needs before torch
    is imported. Its recipe checks are ``ortft.recipe.backends.RULES`` (torch-free)."""

    engine: str  # "module:factory"; the factory takes the loaded recipe, returns an Engine
    env: dict[str, str] = field(default_factory=dict)


# The ort backend's process, where ORT's threads and PyTorch's OpenMP threads share the cores:
# after a PyTorch kernel ORT calls (backends/ortmodule/kernels.py), or the optimizer step, libgomp's
# workers spin-wait 300,000 times by default, taking a core from the ORT MatMul that runs next.
# Measured on 2 cores (`ortft bench`, benchmarks/README.md): with 1000 spins ORT ran at 0.89x
# PyTorch on bert-cls against 0.61x with the default, 0.92x against 0.87x on gpt2-clm. libgomp
# reads it when torch is imported, so the CLI sets it before; the environment's own setting wins.
ORT_THREAD_ENV = {"GOMP_SPINCOUNT": "1000"}

REGISTRY: dict[str, Backend] = {
    "ort": Backend("ortft.backends.torch.engine:create", ORT_THREAD_ENV),
    "torch": Backend("ortft.backends.torch.engine:create"),
    "auto": Backend("ortft.backends.torch.engine:create"),
    "ort-ondevice": Backend("ortft.backends.ondevice.engine:create"),
}
_FACTORIES: dict[str, Callable[[LoadedRecipe], Engine]] = {}


def _load(path: str) -> Any:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def names() -> list[str]:
    """Every backend.name a recipe may use: the built-in ones, then registered ones."""
    from ortft.recipe import backends as rules  # here, not at the top: run.summary imports
    # backends.report, so this package loads on `--help`, which need not load tasks and pydantic

    return rules.names()


def register(name: str, factory: Callable[[LoadedRecipe], Engine]) -> None:
    """Add an engine from outside the package (a plugin, or a test's toy engine)."""
    from ortft.recipe import backends as rules

    _FACTORIES[name] = factory
    rules.allow(name)  # so a recipe may name it


def create(loaded: LoadedRecipe) -> Engine:
    """The engine for ``backend.name``; its module (and framework) is imported only now."""
    name = loaded.recipe.backend.name
    if name in _FACTORIES:
        return _FACTORIES[name](loaded)
    if name not in REGISTRY:
        raise ValueError(f"unknown backend {name} (known: {', '.join(names())})")
    return _load(REGISTRY[name].engine)(loaded)


def process_env(name: str) -> dict[str, str]:
    """Environment the backend's process needs before torch is imported (the CLI sets it)."""
    entry = REGISTRY.get(name)
    return dict(entry.env) if entry is not None else {}
