"""Logging options: TensorBoard events and the curves PNG, written from metrics rows."""

from __future__ import annotations

from pathlib import Path

import pytest

from ortft.core.errors import InputError
from ortft.recipe.schema import LoggingSection
from ortft.run.tracking import PLOT_NAME, Tracker, check

ROWS = [
    {"kind": "train", "step": 1, "epoch": 0.1, "loss": 0.9, "lr": 1e-3, "time_s": 1.0},
    {"kind": "train", "step": 2, "epoch": 0.2, "loss": 0.7, "lr": 1e-3, "time_s": 2.0},
    {"kind": "eval", "step": 2, "epoch": 0.2, "loss": 0.8, "accuracy": 0.6, "f1_macro": 0.5},
]


def test_plot_and_tensorboard(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    pytest.importorskip("tensorboard")
    tracker = Tracker(tmp_path, LoggingSection(tensorboard=True, plot=True), None)
    for row in ROWS:
        tracker.write(row)
    tracker.close()
    assert (tmp_path / "metrics.jsonl").read_text().count("\n") == 3
    png = (tmp_path / PLOT_NAME).read_bytes()
    assert png.startswith(b"\x89PNG")
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))


def test_a_missing_package_is_an_input_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "tensorboard" else real(name, *a),
    )
    with pytest.raises(InputError, match="logging.tensorboard: needs the 'tensorboard' package"):
        check(LoggingSection(tensorboard=True))
