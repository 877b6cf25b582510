"""An install without ONNX Runtime training (the current profile): recipes naming ort still
validate, a run on a backend that needs it is refused in one line before any work, and
backend.name=auto trains on torch, recording why it left ORTModule out.

In the ort profile the absence is simulated by hiding the installed distribution; in the
current profile it is real. The CLI runs in this process (CliRunner): only torch trains here.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest
from conftest import tiny_classifier, write_classification_csv, write_recipe
from typer.testing import CliRunner

from ortft.cli.app import app
from ortft.core.errors import EXIT_USAGE, RecipeError
from ortft.env import ort_training

# click >= 8.2 keeps stdout and stderr apart by default and dropped mix_stderr
if "mix_stderr" in inspect.signature(CliRunner.__init__).parameters:
    runner = CliRunner(mix_stderr=False)
else:
    runner = CliRunner()


@pytest.fixture(autouse=True)
def no_ort_training(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ort_training, "installed", lambda: None)


def invoke(*args: object):
    return runner.invoke(app, [str(a) for a in args])


def refused(result) -> str:
    """Exit 2, one `error:` line on stderr naming the ort profile, no traceback; that line."""
    assert result.exit_code == EXIT_USAGE, (result.exit_code, result.output)
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.stderr and result.stdout == ""
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.stderr
    assert "needs ONNX Runtime training" in errors[0] and "the ort profile" in errors[0]
    return errors[0]


def recipe(folder: Path, backend: str, rows: str | None = None, **more: object) -> Path:
    """A tiny classifier; ``rows``: the train file's text (default: 160 good rows); ``more``:
    top-level sections to add."""
    data = folder / "train.csv"
    if rows is None:
        write_classification_csv(data)
    else:
        data.write_text(rows)
    r = tiny_classifier("train.csv", backend=backend, max_steps=2, batch_size=4, eval_every=2)
    r["export"] = {"enabled": False}
    return write_recipe(folder / f"{backend}.yaml", {**r, **more})


@pytest.mark.parametrize("backend", ["ort", "ort-ondevice", "auto"])
def test_a_recipe_naming_an_ort_backend_validates(tmp_path: Path, backend: str) -> None:
    """Validation never asks what is installed: a run's saved recipe loads everywhere."""
    path = recipe(tmp_path, backend)
    result = invoke("validate", path)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == f"ok  {path}"


@pytest.mark.parametrize("backend", ["ort", "ort-ondevice"])
def test_train_is_refused_before_any_work(tmp_path: Path, backend: str) -> None:
    """The train file has no text column: reading it would fail otherwise, so the one line
    comes before the data is read; no run folder is made."""
    path = recipe(tmp_path, backend, rows="words,label\na b,pos\n")
    line = refused(invoke("train", path, "--output-dir", tmp_path / "run"))
    assert line.startswith(f"error: backend.name={backend} needs ONNX Runtime training")
    assert line.endswith("or train with backend.name=torch or auto")
    assert not (tmp_path / "run").exists()


def test_the_run_itself_refuses_it_for_callers_other_than_the_cli(tmp_path: Path) -> None:
    """ortft hpo's trials and API users start runs through the lifecycle, not `ortft train`."""
    from ortft.recipe import io as recipe_io
    from ortft.run import lifecycle

    loaded = recipe_io.load(recipe(tmp_path, "ort", rows="words,label\na b,pos\n"))
    with pytest.raises(RecipeError, match="backend.name=ort needs ONNX Runtime training"):
        lifecycle.run(loaded, output_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_the_line_names_the_pythons_that_have_a_wheel() -> None:
    on_313 = ort_training.backend_problem("ort", python=(3, 13))
    assert on_313 and "wheels for Python 3.11 and 3.12 only, not 3.13" in on_313
    assert ort_training.backend_problem("torch") is None
    assert ort_training.backend_problem("auto") is None


def test_bench_refuses_an_ort_variant_up_front(tmp_path: Path) -> None:
    path = recipe(tmp_path, "torch")
    result = invoke("bench", path, "--backends", "torch,ort", "--steps", "3", "--warmup", "1")
    assert refused(result).startswith("error: --backends ort: backend.name=ort needs")


def test_hpo_refuses_an_ort_backend_up_front(tmp_path: Path) -> None:
    space = {"backend.name": {"type": "categorical", "choices": ["torch", "ort"]}}
    path = recipe(tmp_path, "torch", hpo={"metric": "eval_loss", "params": space})
    result = invoke("hpo", path, "--trials", "1", "--output-dir", tmp_path / "study")
    assert "hpo.params.backend.name: 'ort' gives: backend.name=ort needs" in refused(result)
    assert not (tmp_path / "study").exists()


def test_export_training_artifacts_is_refused_before_the_export(tmp_path: Path) -> None:
    """The source does not even exist: the one line comes before anything is read."""
    result = invoke("export", tmp_path / "no-run", "--training-artifacts")
    line = refused(result)
    assert line.startswith("error: --training-artifacts needs ONNX Runtime training")
    assert line.endswith("or export without --training-artifacts")


def test_auto_trains_on_torch_and_records_why_ort_was_not_probed(tmp_path: Path) -> None:
    path = recipe(tmp_path, "auto")
    result = invoke("train", path, "--output-dir", tmp_path / "run", "--json")
    assert result.exit_code == 0, result.stderr
    backend = json.loads(result.stdout)["backend"]
    assert backend["requested"] == "auto" and backend["used"] == "torch"
    ort = backend["probe"]["backends"]["ort"]
    assert ort["skipped"] == "ONNX Runtime training is not installed (the current profile has none)"
    assert "median_step_s" not in ort and backend["probe"]["route"] == "torch"
    assert "ort not probed (ONNX Runtime training is not installed" in result.stderr
