"""Interrupting real runs: kill -9, Ctrl-C, SIGTERM and a damaged checkpoint, then resume.

Each test runs the CLI in a subprocess with a tiny model, `training.max_steps=40` and
`checkpoint.save_every=2`, and stops it as soon as step 4's checkpoint is on disk: 36 steps and
18 fsynced checkpoints of margin to interrupt it reliably, a few seconds of training in all.

Resume exactness, measured on CPU (2 cores, torch 2.6.0, onnxruntime-training 1.19.2):
- torch backend, dropout 0.1: bitwise the same losses as the uninterrupted run (asserted).
- ort backend, dropout 0 and 0.1: bitwise the same losses (asserted). ORT draws dropout masks
  from its own in-graph RNG, which no checkpoint can save; ortft reseeds it before every
  micro-batch from training.seed and the micro-step (backends/ortmodule/rng.py). Before that, killed
  after step 4's checkpoint and resumed, over 60 steps: the max |loss difference| was 0.025.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import tiny_classifier, write_classification_csv, write_recipe
from helpers import losses, run_cli, start_cli, summary

from ortft.checkpoint import store as checkpoint

STEPS = 40
ENV = {**os.environ, "NO_COLOR": "1"}


def make_recipe(tmp: Path, backend: str, dropout: float) -> Path:
    write_classification_csv(tmp / "train.csv")
    recipe = tiny_classifier("train.csv", backend=backend)
    recipe["model"]["dropout"] = dropout
    recipe["data"]["eval_fraction"] = 0.0  # no eval: only training steps to compare
    recipe["checkpoint"] = {"save_every": 2, "keep_last": 2}
    recipe["export"] = {"enabled": False}
    return write_recipe(tmp / "r.yaml", recipe)


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return run_cli("train", *args, base_env=ENV, timeout=600, cwd=cwd)


def start(tmp: Path, *args: str, cwd: Path | None = None) -> tuple[subprocess.Popen, Path]:
    """Start a run in the background; its stderr goes to a file (a pipe could fill and block it)."""
    err = tmp / f"stderr-{time.monotonic_ns()}.txt"
    with open(err, "w") as fh:
        proc = start_cli(
            "train", *args, base_env=ENV, cwd=cwd, stdout=subprocess.DEVNULL, stderr=fh
        )
    return proc, err


def wait_for(path: Path, proc: subprocess.Popen, err: Path, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            pytest.fail(
                f"the run ended (exit {proc.returncode}) before {path} appeared:\n"
                + err.read_text()
            )
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"{path} did not appear within {timeout}s")
        time.sleep(0.02)


@pytest.mark.parametrize(
    "backend, dropout",
    [("torch", 0.1), pytest.param("ort", 0.0, marks=pytest.mark.ort),
     pytest.param("ort", 0.1, marks=pytest.mark.ort)],
)  # fmt: skip
def test_sigkill_then_resume_reproduces_the_uninterrupted_run(
    tmp_path: Path, backend: str, dropout: float
) -> None:
    recipe = make_recipe(tmp_path, backend, dropout)
    args = [str(recipe), f"training.max_steps={STEPS}"]
    full, cut = tmp_path / "full", tmp_path / "cut"
    cwd = tmp_path / "cwd"  # a run writes only under its output dir: nothing lands here
    cwd.mkdir()
    res = run(*args, "--output-dir", str(full), cwd=cwd)
    assert res.returncode == 0, res.stderr

    proc, err = start(tmp_path, *args, "--output-dir", str(cut), cwd=cwd)
    wait_for(cut / "step-000004" / checkpoint.MANIFEST, proc, err)
    proc.send_signal(signal.SIGKILL)  # no handler, no cleanup: the process just stops
    assert proc.wait(timeout=60) == -signal.SIGKILL
    assert not (cut / "summary.json").exists() or summary(cut)["status"] != "completed"

    res = run(*args, "--output-dir", str(cut), cwd=cwd)
    assert res.returncode == 0, res.stderr
    assert "resuming from" in res.stderr
    assert list(cwd.iterdir()) == []
    resumed_from = summary(cut)["resumed_from"]
    assert int(resumed_from.rsplit("-", 1)[1]) >= 4
    expected, got = (
        losses(full, by_step=True, unique_steps=True),
        losses(cut, by_step=True, unique_steps=True),
    )
    assert sorted(got) == list(range(1, STEPS + 1))
    assert got == expected  # exactly: same data order, RNG, optimizer and scheduler state
    assert summary(cut)["metrics"]["train_loss"] == summary(full)["metrics"]["train_loss"]


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_checkpoints_and_prints_the_resume_command(
    tmp_path: Path, sig: int, code: int
) -> None:
    recipe = make_recipe(tmp_path, "torch", 0.1)
    overrides = [f"training.max_steps={STEPS}", "training.log_every=1"]
    run_dir = tmp_path / "run"
    proc, err = start(tmp_path, str(recipe), *overrides, "--output-dir", str(run_dir))
    wait_for(run_dir / "step-000004" / checkpoint.MANIFEST, proc, err)
    proc.send_signal(sig)
    assert proc.wait(timeout=120) == code, err.read_text()
    stderr = err.read_text()
    assert "Traceback" not in stderr

    s = summary(run_dir)
    assert s["status"] == "interrupted"
    stopped = s["steps"]
    assert 4 <= stopped < STEPS
    ckpt = run_dir / checkpoint.checkpoint_name(stopped)
    assert checkpoint.verify(ckpt, deep=True) is None  # a complete checkpoint at that very step
    assert s["paths"]["last_checkpoint"] == str(ckpt)
    assert not list(run_dir.glob(".step-*"))  # no temp folders left behind

    # the last line is the error, with the exact command to resume (overrides included)
    command = shlex.join(["ortft", "train", str(recipe), *overrides, "--output-dir", str(run_dir)])
    last = stderr.rstrip("\n").splitlines()[-1]
    assert last.startswith(f"error: interrupted at step {stopped}; checkpoint {ckpt}"), last
    assert last.endswith(f"resume with: {command}"), last

    argv = shlex.split(last.rsplit("resume with: ", 1)[1])
    assert argv[:2] == ["ortft", "train"]
    res = run_cli(*argv[1:], base_env=ENV, timeout=600)
    assert res.returncode == 0, res.stderr
    assert f"resuming from {ckpt} (step {stopped})" in res.stderr
    assert summary(run_dir)["status"] == "completed"
    assert sorted(losses(run_dir, by_step=True, unique_steps=True)) == list(range(1, STEPS + 1))


def test_second_sigint_stops_at_once_and_leaves_only_complete_checkpoints(tmp_path: Path) -> None:
    recipe = make_recipe(tmp_path, "torch", 0.0)
    run_dir = tmp_path / "run"
    proc, err = start(
        tmp_path, str(recipe), f"training.max_steps={STEPS}", "--output-dir", str(run_dir)
    )
    wait_for(run_dir / "step-000004" / checkpoint.MANIFEST, proc, err)
    proc.send_signal(signal.SIGINT)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=120) == 130, err.read_text()
    assert "Traceback" not in err.read_text()
    assert summary(run_dir)["status"] == "interrupted"
    found = checkpoint.list_checkpoints(run_dir)
    assert found and all(checkpoint.verify(p, deep=True) is None for p in found)
    assert not list(run_dir.glob(".step-*"))
    res = run(str(recipe), f"training.max_steps={STEPS}", "--output-dir", str(run_dir))
    assert res.returncode == 0, res.stderr
    assert sorted(losses(run_dir, by_step=True, unique_steps=True)) == list(range(1, STEPS + 1))


def test_resume_auto_skips_a_corrupt_latest_checkpoint(tmp_path: Path) -> None:
    recipe = make_recipe(tmp_path, "torch", 0.1)
    args = [str(recipe), "training.max_steps=6", "checkpoint.keep_last=3"]
    run_dir = tmp_path / "run"
    res = run(*args, "--output-dir", str(run_dir))
    assert res.returncode == 0, res.stderr
    expected = losses(run_dir, by_step=True, unique_steps=True)
    # make it an unfinished run whose newest checkpoint was torn
    (run_dir / "summary.json").unlink()
    weights = run_dir / "step-000006" / "model.safetensors"
    with open(weights, "r+b") as fh:
        fh.truncate(weights.stat().st_size // 2)

    res = run(*args, "--output-dir", str(run_dir))
    assert res.returncode == 0, res.stderr
    assert (
        f"skipping checkpoint {run_dir / 'step-000006'}: model.safetensors is missing or truncated"
        in res.stderr
    )
    assert f"resuming from {run_dir / 'step-000004'} (step 4)" in res.stderr
    assert losses(run_dir, by_step=True, unique_steps=True) == expected
    assert checkpoint.verify(run_dir / "step-000006", deep=True) is None  # rewritten whole
