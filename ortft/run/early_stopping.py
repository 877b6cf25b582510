"""Early stopping and best-model selection: which eval is better, when to stop, and best/.

Both follow one eval metric at a time. Their state lives in ``TrainState`` (so a resumed run
carries on counting), and the best eval's weights in ``<run>/best/`` (``model.safetensors``
and ``best.json``), which ``ortft.checkpoint.best`` writes each time an eval beats the best so
far. At the end, ``checkpoint.final: best`` loads those weights back before ``final/`` and the
ONNX export are written.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ortft.checkpoint.best import BEST_DIR, read_best
from ortft.checkpoint.store import TrainState
from ortft.recipe.schema import Recipe, metric_mode

if TYPE_CHECKING:
    import torch

log = logging.getLogger("ortft")


def improved(value: float, reference: float | None, mode: str, min_delta: float = 0.0) -> bool:
    """Whether ``value`` beats ``reference`` by more than ``min_delta`` in direction ``mode``."""
    if reference is None:
        return True
    return value < reference - min_delta if mode == "min" else value > reference + min_delta


class Selector:
    """Watches evals: tracks the best one and says when early stopping should end the run."""

    def __init__(self, recipe: Recipe):
        self.keep_best = recipe.checkpoint.final == "best"
        self.es = recipe.training.early_stopping
        self.metric = recipe.selection_metric()
        same = self.es is not None and self.es.metric == self.metric
        self.mode = metric_mode(self.metric, self.es.mode if same and self.es else "auto")
        self.final_step: int | None = None  # the step final/ holds, once known
        self.final_eval: dict[str, float] = {}  # the eval metrics of that step, when it is the best

    def observe(self, state: TrainState) -> bool:
        """Record ``state.eval_metrics``; True when they are a new best (save best/ then)."""
        metrics = {f"eval_{k}": v for k, v in state.eval_metrics.items()}
        if self.es is not None:
            value = metrics[self.es.metric]
            mode = metric_mode(self.es.metric, self.es.mode)
            if improved(value, state.stop_reference, mode, self.es.min_delta):
                state.stop_reference, state.evals_without_improvement = value, 0
            else:
                state.evals_without_improvement += 1
        if not self.keep_best:
            return False
        value = metrics[self.metric]
        if improved(value, state.best_value, self.mode):
            state.best_step, state.best_value = state.step, value
            return True
        return False

    def should_stop(self, state: TrainState) -> bool:
        return self.es is not None and state.evals_without_improvement >= self.es.patience

    def stop_message(self, state: TrainState) -> str:
        assert self.es is not None
        return (
            f"early stopping at step {state.step}: {self.es.metric} has not improved on "
            f"{state.stop_reference:.4f} for {self.es.patience} evaluation(s)"
        )

    def load_final(self, run_dir: Path, model: torch.nn.Module, state: TrainState) -> None:
        """``final: best``: load best/ into ``model``; otherwise final/ is the last step."""
        self.final_step = state.step
        if not self.keep_best or state.best_step is None:
            return
        meta = read_best(run_dir)
        if meta is None or meta.get("step") != state.best_step:
            log.warning(
                "best/ does not hold step %s's weights; final/ keeps the last step (%d)",
                state.best_step,
                state.step,
            )
            return
        if state.best_step != state.step:
            from safetensors.torch import load_model

            load_model(model, str(run_dir / BEST_DIR / "model.safetensors"))
        self.final_step, self.final_eval = state.best_step, meta["metrics"]
        log.info(
            "final/ holds the best eval: step %d, %s %.4f",
            state.best_step,
            self.metric,
            state.best_value,
        )

    def report(self, state: TrainState, stop_reason: str | None) -> dict[str, Any]:
        """The summary's selection fields: final, final_step, best_metric, stopped_early,
        stopped_at_step — ``RunSummary`` field names, so ``summary.apply(selector.report(...))``
        sets them (a dict summary takes them with ``update``)."""
        best = None
        if self.keep_best and state.best_step is not None:
            best = {
                "name": self.metric,
                "mode": self.mode,
                "value": state.best_value,
                "step": state.best_step,
            }
        stopped = stop_reason == "early_stopping"
        return {
            "final": "best" if self.keep_best else "last",
            "final_step": self.final_step if self.final_step is not None else state.step,
            "best_metric": best,
            "stopped_early": stopped,
            "stopped_at_step": state.step if stopped else None,
        }
