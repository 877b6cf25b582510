"""A run owns its output directory: a second `ortft train` on it is refused (exit 2, naming the
holder's pid) while the first lives, and a run killed with kill -9 leaves no stale lock."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from conftest import tiny_classifier, write_classification_csv, write_recipe
from helpers import start_cli


def _train(recipe: Path, run: Path, *overrides: str) -> subprocess.Popen:
    return start_cli(
        "train",
        str(recipe),
        *overrides,
        "--output-dir",
        str(run),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_second_run_on_a_live_runs_directory_is_refused(tmp_path: Path) -> None:
    write_classification_csv(tmp_path / "train.csv")
    r = tiny_classifier("train.csv", backend="torch", max_steps=100000, batch_size=8)
    r["export"] = {"enabled": False}
    recipe, run = write_recipe(tmp_path / "r.yaml", r), tmp_path / "run"
    first = _train(recipe, run)
    try:
        deadline = time.time() + 120
        while not (run / "metrics.jsonl").exists():  # training has started: the lock is held
            assert first.poll() is None and time.time() < deadline, first.stderr.read()
            time.sleep(0.2)
        second = _train(recipe, run, "training.lr=1e-3")
        _, err = second.communicate(timeout=120)
        assert second.returncode == 2, err
        assert f"is in use by another ortft run (pid {first.pid})" in err
        assert "Traceback" not in err
    finally:
        first.send_signal(signal.SIGKILL)  # kill -9: no handler runs, the kernel drops the lock
        first.wait(timeout=60)
    third = _train(recipe, run, "training.max_steps=2", "checkpoint.resume=never")
    _, err = third.communicate(timeout=300)
    assert third.returncode == 0, err  # the dead run's lock was taken over
    assert (run / ".ortft.lock").read_text().strip() == str(third.pid)


def test_ranks_other_than_0_do_not_take_the_lock(tmp_path: Path, monkeypatch) -> None:
    from ortft.run import rundir

    monkeypatch.setenv("RANK", "1")
    with rundir.lock(tmp_path), rundir.lock(tmp_path):  # no lock: no conflict
        pass
    assert not (tmp_path / rundir.LOCK_NAME).exists()
    monkeypatch.setenv("RANK", "0")
    with rundir.lock(tmp_path):
        assert (tmp_path / rundir.LOCK_NAME).read_text().strip() == str(os.getpid())
