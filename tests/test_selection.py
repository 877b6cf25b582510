"""Early stopping and best-model selection: the rule on value sequences, then one tiny run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import tiny_classifier, write_classification_csv, write_recipe
from helpers import run_cli

from ortft.checkpoint.store import TrainState
from ortft.recipe.schema import Recipe
from ortft.run.early_stopping import Selector, improved


def recipe(**extra: object) -> Recipe:
    data = tiny_classifier("train.csv", backend="torch", eval_every=1)
    for section, values in extra.items():
        data.setdefault(section, {}).update(values)
    return Recipe.model_validate(data)


def feed(
    selector: Selector, values: list[float], name: str = "accuracy"
) -> tuple[int | None, TrainState]:
    """Evals with these values at steps 1, 2, ...; the step early stopping ends at (or None)."""
    state = TrainState()
    for step, value in enumerate(values, 1):
        state.step, state.eval_metrics = step, {"loss": 1.0, "accuracy": 0.5, name: value}
        selector.observe(state)
        if selector.should_stop(state):
            return step, state
    return None, state


def test_improved_respects_mode_and_min_delta() -> None:
    assert improved(0.5, None, "max")
    assert improved(0.61, 0.6, "max") and not improved(0.6, 0.6, "max")
    assert improved(0.4, 0.5, "min") and not improved(0.5, 0.5, "min")
    assert not improved(0.605, 0.6, "max", min_delta=0.01)
    assert improved(0.62, 0.6, "max", min_delta=0.01)


def test_early_stopping_counts_evals_without_improvement() -> None:
    es = {"early_stopping": {"metric": "eval_accuracy", "patience": 2}}
    # 0.6 at eval 3 ties the best (no improvement), 0.59 is worse: patience 2 runs out at eval 4
    assert feed(Selector(recipe(training=es)), [0.5, 0.6, 0.6, 0.59, 0.9])[0] == 4
    # an improvement resets the count
    assert feed(Selector(recipe(training=es)), [0.5, 0.5, 0.6, 0.6, 0.6])[0] == 5
    # min_delta: +0.005 is not an improvement
    es_delta = {"early_stopping": {"metric": "eval_accuracy", "patience": 2, "min_delta": 0.01}}
    assert feed(Selector(recipe(training=es_delta)), [0.5, 0.505, 0.508])[0] == 3
    # loss: lower is better (mode auto)
    es_loss = {"early_stopping": {"metric": "eval_loss", "patience": 1}}
    assert feed(Selector(recipe(training=es_loss)), [0.9, 0.8, 0.85], name="loss")[0] == 3


def test_best_tracks_the_selection_metric() -> None:
    sel = Selector(recipe(checkpoint={"final": "best", "best_metric": "eval_accuracy"}))
    stop, state = feed(sel, [0.5, 0.7, 0.6, 0.7])
    assert stop is None  # no early stopping configured
    assert (state.best_step, state.best_value) == (2, 0.7)  # a tie later does not replace it
    report = sel.report(state, None)
    assert report["best_metric"] == {
        "name": "eval_accuracy",
        "mode": "max",
        "value": 0.7,
        "step": 2,
    }
    assert report["stopped_early"] is False


@pytest.mark.parametrize(
    "extra, message",
    [
        (
            {"training": {"early_stopping": {"patience": 2}, "eval_every": None}},
            "needs training.eval_every",
        ),
        ({"checkpoint": {"final": "best"}, "data": {"eval_fraction": 0}}, "needs eval data"),
        ({"training": {"early_stopping": {"metric": "eval_perplexity"}}}, "not a metric of"),
    ],
)
def test_recipe_rejects_selection_without_evals(extra: dict, message: str) -> None:
    from pydantic import ValidationError

    data = tiny_classifier("train.csv", eval_every=1)
    for section, values in extra.items():
        data[section] = {**data.get(section, {}), **values}
    with pytest.raises(ValidationError, match=message):
        Recipe.model_validate(data)


def test_run_stops_early_and_final_holds_the_best(tmp_path: Path) -> None:
    """lr so small the eval accuracy never moves: evals at 1, 2, 3, then patience 2 stops it."""
    write_classification_csv(tmp_path / "train.csv")
    r = tiny_classifier("train.csv", backend="torch", max_steps=20, eval_every=1, lr=1e-7)
    r["training"]["early_stopping"] = {"metric": "eval_accuracy", "patience": 2}
    r["checkpoint"] = {"final": "best", "save_every": 3}  # step-000003: the last weights
    r["export"] = {"enabled": False}
    path = write_recipe(tmp_path / "r.yaml", r)
    run = tmp_path / "run"
    res = run_cli(
        "train", str(path), "--output-dir", str(run), "--json", timeout=600, env={"NO_COLOR": "1"}
    )
    assert res.returncode == 0, res.stderr
    s = json.loads(res.stdout)
    assert s["status"] == "completed" and s["stop_reason"] == "early_stopping"
    assert s["steps"] == 3 and s["stopped_early"] is True and s["stopped_at_step"] == 3
    assert s["final"] == "best" and s["final_step"] == 1  # ties never replace the best
    assert s["best_metric"]["name"] == "eval_accuracy" and s["best_metric"]["step"] == 1
    assert "early stopping at step 3" in res.stderr
    evals = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evals if e["kind"] == "eval"] == [1, 2, 3]
    # final/ holds best/'s weights (step 1), not the last step's
    from safetensors.numpy import load_file

    best = load_file(run / "best" / "model.safetensors")
    final = load_file(run / "final" / "model.safetensors")
    last = load_file(run / "step-000003" / "model.safetensors")
    assert json.loads((run / "best" / "best.json").read_text())["step"] == 1
    assert all((final[name] == value).all() for name, value in best.items())
    assert any((last[name] != value).any() for name, value in best.items())
