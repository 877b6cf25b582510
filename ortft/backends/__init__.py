"""Engines: what runs the model's forward, backward and optimizer step. The loop sees only ``Engine``.

- ``torch``, ``ort``, ``auto`` (``pytorch.py``): a PyTorch module engine — eager PyTorch, ORTModule
  (``ort.py``), or whichever a short probe finds faster (``auto.py``); DDP, DeepSpeed and AMP live here.
- ``ort-ondevice`` (``ondevice.py``): ONNX Runtime's on-device training API; no PyTorch in the loop.

Adding a backend is a new file with a class that follows ``Engine`` plus one line in ``REGISTRY``
(``register`` does the same from outside the package, e.g. a test's toy engine). This module is
torch-free: engines import their frameworks when they are created.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ortft.run.summary import BackendReport, Precision

if TYPE_CHECKING:
    import numpy as np

    from ortft.checkpoint import TrainState
    from ortft.recipe.io import LoadedRecipe
    from ortft.recipe.schema import Recipe
    from ortft.tasks import Encoded

__all__ = [
    "REGISTRY",
    "BackendReport",
    "Engine",
    "Started",
    "StepResult",
    "create",
    "names",
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


@dataclass
class StepResult:
    loss: float  # the optimizer step's mean loss (over micro-batches and ranks)
    lr: float  # the learning rate this step used
    applied: bool = True  # False when fp16 loss scaling skipped the update (overflow)


class Engine(Protocol):
    name: str  # backend.name as requested ("auto" keeps that name; report() says what ran)

    def start(self, recipe: Recipe) -> Started:
        """Device, threads, seeds, determinism, process group: once, before any data work."""

    def is_main(self) -> bool:
        """The one process that logs and writes files (rank 0; always true in one process)."""

    def tokenizer(
        self, loaded: LoadedRecipe, run_dir: Path, task: Any, train_rows: list, labels: Any
    ) -> Any:
        """The tokenizer the run uses (loaded, trained, or the one that came with artifacts)."""

    def prepare(
        self,
        loaded: LoadedRecipe,
        task: Any,
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

    def extra_metrics(self, task: Any, tokenizer: Any, encoded: Encoded) -> dict[str, float]:
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

    def select_final(self, selector: Any, run_dir: Path, state: TrainState) -> None:
        """``checkpoint.final: best``: load the best eval's weights before final/ is written."""

    def write_final(self, folder: Path) -> None:
        """The trained model's files into ``folder`` (a temporary folder the loop swaps in)."""

    def export(self, run_dir: Path, final_dir: Path, samples: Encoded) -> dict[str, Any] | None:
        """The ONNX export and its parity report (``summary.export``); None when disabled."""

    def parameter_counts(self) -> tuple[int, int]:
        """(all parameters, trainable parameters)."""

    def precision(self) -> Precision | None:
        """summary.precision (dtype, fp16 steps skipped); None where it does not apply."""

    def report(self) -> BackendReport: ...

    def close(self, ok: bool) -> None:
        """Release the engine (process group, sessions); ``ok``: the run ended normally."""


# backend.name -> "module:factory"; a factory takes the loaded recipe and returns an Engine.
REGISTRY: dict[str, str] = {
    "torch": "ortft.backends.pytorch:create",
    "ort": "ortft.backends.pytorch:create",
    "auto": "ortft.backends.pytorch:create",
    "ort-ondevice": "ortft.backends.ondevice:create",
}
_FACTORIES: dict[str, Callable[[LoadedRecipe], Engine]] = {}


def names() -> list[str]:
    """Every backend.name a recipe may use: the built-in ones, then registered ones."""
    return [*REGISTRY, *(n for n in _FACTORIES if n not in REGISTRY)]


def register(name: str, factory: Callable[[LoadedRecipe], Engine]) -> None:
    """Add an engine from outside the package (a plugin, or a test's toy engine)."""
    _FACTORIES[name] = factory


def create(loaded: LoadedRecipe) -> Engine:
    """The engine for ``backend.name``; its module (and framework) is imported only now."""
    name = loaded.recipe.backend.name
    if name in _FACTORIES:
        return _FACTORIES[name](loaded)
    if name not in REGISTRY:
        raise ValueError(f"unknown backend {name} (known: {', '.join(sorted(REGISTRY))})")
    module, _, factory = REGISTRY[name].partition(":")
    return getattr(importlib.import_module(module), factory)(loaded)
