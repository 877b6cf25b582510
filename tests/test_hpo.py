"""`ortft hpo`: the search space is validated, a tiny 3-trial study runs, and it resumes."""

from __future__ import annotations

import json
from pathlib import Path

import optuna  # noqa: F401  (make setup installs it: missing, these tests fail at import)
import pytest
from conftest import tiny_classifier, write_classification_csv, write_recipe
from helpers import run_cli

from ortft.core.errors import RecipeError
from ortft.recipe import io as recipe_io
from ortft.tools import hpo

SPACE = {
    "training.lr": {"type": "loguniform", "low": 1e-4, "high": 1e-2},
    "training.batch_size": {"type": "categorical", "choices": [8, 16]},
    "training.warmup_ratio": {"type": "uniform", "low": 0.0, "high": 0.2},
}


def hpo_recipe(tmp_path: Path, **space: dict) -> Path:
    write_classification_csv(tmp_path / "train.csv")
    r = tiny_classifier("train.csv", backend="torch", max_steps=4, eval_every=2)
    r["export"] = {"enabled": True}  # trials skip the export all the same
    r["hpo"] = {"metric": "eval_loss", "pruning": {"startup_trials": 1}, "params": space or SPACE}
    return write_recipe(tmp_path / "search.yaml", r)


def run_hpo(recipe: Path, out: Path, trials: int) -> dict:
    res = run_cli(
        "hpo",
        str(recipe),
        "--trials",
        str(trials),
        "--output-dir",
        str(out),
        "--json",
        timeout=600,
        env={"NO_COLOR": "1"},
    )
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_search_space_bounds_must_make_valid_recipes(tmp_path: Path) -> None:
    path = hpo_recipe(tmp_path, **{"training.lr": {"type": "uniform", "low": 1e-4, "high": 2.0}})
    loaded = recipe_io.load(path)
    with pytest.raises(RecipeError, match=r"hpo.params.training.lr: 2.0 gives: training.lr"):
        hpo.check_space(path, [], loaded.recipe.hpo)


def test_search_space_keys_are_recipe_values(tmp_path: Path) -> None:
    path = hpo_recipe(tmp_path, **{"training": {"type": "int", "low": 1, "high": 2}})
    with pytest.raises(RecipeError, match="not a tunable recipe key: training"):
        recipe_io.load(path)


def test_literal_round_trips_through_yaml() -> None:
    import yaml

    for value in (1e-05, 0.001, 3.5e-4, 16, True, "cosine"):
        assert yaml.safe_load(hpo._literal(value)) == value


def test_three_trials_then_resume(tmp_path: Path) -> None:
    recipe, out = hpo_recipe(tmp_path), tmp_path / "search-hpo"
    first = run_hpo(recipe, out, trials=2)
    assert (out / "study.db").exists()
    assert [t["number"] for t in first["trials"]] == [0, 1]
    # the same storage again, asking for 3: only the missing trial runs
    second = run_hpo(recipe, out, trials=3)
    trials = second["trials"]
    assert [t["number"] for t in trials] == [0, 1, 2]
    assert trials[:2] == first["trials"]  # the first two were loaded, not rerun
    assert all(t["state"] in ("complete", "pruned") for t in trials)
    for t in trials:
        run = Path(t["run_dir"])
        assert run.name == f"trial-{t['number']:03d}" and run.parent == out
        summary = json.loads((run / "summary.json").read_text())
        assert summary["status"] == ("completed" if t["state"] == "complete" else "pruned")
        assert not (run / "onnx").exists()  # trials skip the export
        if t["state"] == "complete":
            assert t["value"] == pytest.approx(summary["metrics"]["eval_loss"])
    best = second["best"]
    assert best["value"] == min(t["value"] for t in trials if t["state"] == "complete")
    # the best recipe trains as is: the best values, no hpo section, absolute data path
    loaded = recipe_io.load(Path(best["recipe"]))
    assert loaded.recipe.hpo is None
    assert loaded.recipe.training.lr == pytest.approx(best["params"]["training.lr"])
    assert loaded.recipe.training.batch_size == best["params"]["training.batch_size"]
    assert Path(loaded.recipe.data.train).is_absolute()
    # asking again for 3 runs nothing
    assert run_hpo(recipe, out, trials=3)["trials"] == trials


def test_direction_study_and_storage(tmp_path: Path) -> None:
    """hpo.direction: maximize, on eval_loss (auto would minimize it), in the study and storage
    given by --study and --storage: the study is there under that name and to maximize, the
    best trial is the largest eval_loss, and the default study.db is never written. In
    process, as the trials themselves run (a fresh Python would spend most of the time on
    imports)."""
    from typer.testing import CliRunner

    from ortft.cli.app import app

    recipe, out = hpo_recipe(tmp_path, **{"training.lr": SPACE["training.lr"]}), tmp_path / "o"
    storage = f"sqlite:///{tmp_path / 'elsewhere.db'}"
    overrides = ["hpo.direction=maximize", "hpo.pruning.enabled=false", "training.max_steps=2"]
    options = ["--study", "mine", "--storage", storage, "--output-dir", str(out)]
    args = ["hpo", str(recipe), *overrides, "--trials", "2", *options, "--json"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output[-3000:]
    result = json.loads(res.stdout)
    assert result["study"] == "mine" and result["storage"] == storage
    assert result["direction"] == "maximize"
    assert optuna.get_all_study_names(storage) == ["mine"]
    assert optuna.load_study(study_name="mine", storage=storage).direction.name == "MAXIMIZE"
    assert not (out / "study.db").exists()
    values = [t["value"] for t in result["trials"] if t["state"] == "complete"]
    assert len(values) == 2 and values[0] != values[1]
    assert result["best"]["value"] == max(values)
