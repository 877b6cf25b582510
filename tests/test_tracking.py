"""Logging options: trackers chosen in the recipe, read back with their own readers; the
curves PNG; errors before training and warnings during it."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

import pytest
from conftest import tiny_classifier, write_classification_csv, write_recipe
from tracker_readers import OFFLINE, mlflow_client, tensorboard_steps

from ortft.core.errors import InputError, RunError
from ortft.recipe import io as recipe_io
from ortft.recipe.schema import LoggingSection
from ortft.run import lifecycle
from ortft.run.trackers.mlflow_sink import MlflowSink
from ortft.run.tracking import PLOT_NAME, Tracker, check

ROWS = [
    {"kind": "train", "step": 1, "epoch": 0.1, "loss": 0.9, "lr": 1e-3, "time_s": 1.0},
    {"kind": "train", "step": 2, "epoch": 0.2, "loss": 0.7, "lr": 1e-3, "time_s": 2.0},
    {"kind": "eval", "step": 2, "epoch": 0.2, "loss": 0.8, "accuracy": 0.6, "f1_macro": 0.5},
]


def test_plot_and_the_deprecated_tensorboard_flag(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="ortft"):
        spec = LoggingSection(tensorboard=True, plot=True)
    assert spec.trackers == ["tensorboard"]
    assert "logging.tensorboard is deprecated" in caplog.text
    tracker = Tracker(tmp_path, spec, None)
    for row in ROWS:
        tracker.write(row)
    tracker.close()
    assert (tmp_path / "metrics.jsonl").read_text().count("\n") == 3
    assert (tmp_path / PLOT_NAME).read_bytes().startswith(b"\x89PNG")
    assert tensorboard_steps(tmp_path) == [1, 2]
    assert tensorboard_steps(tmp_path, "eval/accuracy") == [2]


@pytest.mark.parametrize("name, package", [("mlflow", "mlflow-skinny"), ("wandb", "wandb")])
def test_a_tracker_not_installed_is_an_input_error(
    monkeypatch: pytest.MonkeyPatch, name: str, package: str
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda mod, *a: None if mod == name else real(mod, *a)
    )
    with pytest.raises(InputError, match=f"logging.trackers: {name} needs the '{package}'"):
        check(LoggingSection(trackers=[name]))


def test_a_malformed_tracking_uri_is_an_input_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_classification_csv(tmp_path / "train.csv")
    path = write_recipe(tmp_path / "r.yaml", tiny_classifier("train.csv"))
    with pytest.raises(Exception, match="logging.tracking_uri.*'htpp//x' is not a tracking URI"):
        recipe_io.load(path, ["logging.trackers=[mlflow]", "logging.tracking_uri=htpp//x"])
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://")
    with pytest.raises(InputError, match="MLFLOW_TRACKING_URI: 'http://' names no host"):
        check(LoggingSection(trackers=["mlflow"]), tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///x.db")  # skinny has no SQLAlchemy
    real = importlib.util.find_spec  # (optuna brings it into the dev venv)
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda m, *a: None if m == "sqlalchemy" else real(m, *a)
    )
    with pytest.raises(InputError, match="needs SQLAlchemy"):
        check(LoggingSection(trackers=["mlflow"]), tmp_path)


def _offline_mlflow(monkeypatch: pytest.MonkeyPatch) -> None:
    """No Hub, no network tracker: MLflow writes to the run's own mlruns/."""
    for key, value in OFFLINE.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


def test_a_tracker_failing_mid_run_is_a_warning_and_the_run_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _offline_mlflow(monkeypatch)
    write_classification_csv(tmp_path / "train.csv")
    recipe = tiny_classifier("train.csv", backend="torch", max_steps=6)
    recipe["checkpoint"] = {"save_every": 2}
    recipe["export"] = {"enabled": False}
    recipe["logging"] = {"trackers": ["tensorboard", "mlflow"]}
    calls = {"n": 0}
    real_log = MlflowSink.log

    def log_then_fail(self: MlflowSink, rows: list) -> None:
        calls["n"] += 1
        if calls["n"] == 2:  # the second checkpoint's rows: the disk is full now
            raise OSError(28, "No space left on device")
        real_log(self, rows)

    monkeypatch.setattr(MlflowSink, "log", log_then_fail)
    loaded = recipe_io.load(write_recipe(tmp_path / "r.yaml", recipe), [])
    with caplog.at_level(logging.WARNING, logger="ortft"):
        s = lifecycle.run(loaded, output_dir=tmp_path / "run")
    assert s.status == "completed" and s.steps == 6
    line = "mlflow: could not log: OSError: [Errno 28] No space left on device"
    assert s.extra["trackers"]["warnings"] == [line]
    assert line in caplog.text
    client = mlflow_client(tmp_path / "run")
    run_id = s.extra["trackers"]["mlflow"]["run_id"]
    steps = [m.step for m in client.get_metric_history(run_id, "train/loss")]
    assert steps == [1, 2]  # what it had before the failure; never called again
    assert tensorboard_steps(tmp_path / "run") == [1, 2, 3, 4, 5, 6]  # the others go on


def test_an_export_that_raises_ends_the_tracker_run_and_the_summary_as_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not left RUNNING in MLflow, nor "running" in summary.json."""
    from ortft.backends.torch.engine import PyTorchEngine
    from ortft.run.summary import RunSummary

    _offline_mlflow(monkeypatch)
    write_classification_csv(tmp_path / "train.csv")
    recipe = tiny_classifier("train.csv", backend="torch", max_steps=2)
    recipe["logging"] = {"trackers": ["mlflow"]}

    def export(*_args: object) -> None:
        raise MemoryError("the export ran out of memory")

    monkeypatch.setattr(PyTorchEngine, "export", export)
    loaded = recipe_io.load(write_recipe(tmp_path / "r.yaml", recipe), [])
    with pytest.raises(RunError, match="^after training: MemoryError: the export ran out of"):
        lifecycle.run(loaded, output_dir=tmp_path / "run")
    s = RunSummary.read(tmp_path / "run" / "summary.json")
    assert s.status == "failed" and s.steps == 2
    assert s.error == "after training: MemoryError: the export ran out of memory"
    client = mlflow_client(tmp_path / "run")
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.info.status == "FAILED"


def test_hpo_logs_each_trial_as_a_child_run(tmp_path: Path) -> None:
    from ortft.tools import hpo

    write_classification_csv(tmp_path / "train.csv")
    r = tiny_classifier("train.csv", backend="torch", max_steps=2, eval_every=2)
    r["logging"] = {"trackers": ["tensorboard", "mlflow"], "experiment": "search"}
    r["hpo"] = {
        "metric": "eval_loss",
        "params": {"training.lr": {"type": "loguniform", "low": 1e-4, "high": 1e-2}},
    }
    path = write_recipe(tmp_path / "search.yaml", r)
    study = tmp_path / "study"
    hpo.run(path, [], trials=2, output_dir=study)
    client = mlflow_client(study)
    exp = client.get_experiment_by_name("search")
    runs = {run.info.run_name: run for run in client.search_runs([exp.experiment_id])}
    assert sorted(runs) == ["search", "trial-000", "trial-001"]
    parent = runs["search"].info.run_id
    for trial in ("trial-000", "trial-001"):
        assert runs[trial].data.tags["mlflow.parentRunId"] == parent
        assert "training.lr" in runs[trial].data.params
        assert tensorboard_steps(study / trial) == [1, 2]  # a sub-folder per trial
    assert runs["search"].info.status == "FINISHED"


def test_a_credential_in_the_tracking_uri_is_never_logged():
    """The URI itself goes to summary.json and to the recipe's params: not its user:token."""
    from ortft.run import trackers
    from ortft.run.trackers.base import redact_uri

    uri = "https://me:s3cret@mlflow.example:5000/api"
    assert redact_uri(uri) == "https://***@mlflow.example:5000/api"
    assert redact_uri("file:/tmp/mlruns") == "file:/tmp/mlruns"
    flat = trackers.flatten({"logging": {"tracking_uri": uri, "run_name": "me:s3cret@x"}})
    assert flat["logging.tracking_uri"] == "https://***@mlflow.example:5000/api"
    assert flat["logging.run_name"] == "me:s3cret@x"  # only the URI is redacted
