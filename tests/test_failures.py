"""Failures while running: a NaN loss and a full disk stop the run with one line and exit 1.

In-process on the torch backend (ORTModule is not involved), with the failure injected by
monkeypatching: a forward that returns NaN, a save that raises ENOSPC.
"""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
import torch
from conftest import tiny_classifier, write_classification_csv, write_recipe
from helpers import summary
from typer.testing import CliRunner

from ortft.backends.torch import models
from ortft.checkpoint import store as checkpoint
from ortft.cli.app import app
from ortft.core import fsutil
from ortft.core.errors import EXIT_FAILED, RunError
from ortft.recipe import io as recipe_io
from ortft.run import lifecycle as train_mod


def make_recipe(tmp: Path, **training: object) -> Path:
    write_classification_csv(tmp / "train.csv", n=80)
    recipe = tiny_classifier("train.csv", backend="torch", **training)
    recipe["data"]["eval_fraction"] = 0.0
    recipe["checkpoint"] = {"save_every": 2, "keep_last": 3}
    recipe["export"] = {"enabled": False}
    return write_recipe(tmp / "r.yaml", recipe)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_loss_stops_with_the_step_and_last_good_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bad: float
) -> None:
    calls = {"n": 0}
    forward = models.TaskModule.forward

    def poisoned(self, *args, **kwargs):  # the 3rd micro-batch (step 3) returns a bad loss
        loss, logits = forward(self, *args, **kwargs)
        calls["n"] += 1
        return (loss * bad if calls["n"] == 3 else loss), logits

    monkeypatch.setattr(models.TaskModule, "forward", poisoned)
    run_dir = tmp_path / "run"
    with pytest.raises(RunError) as info:
        train_mod.run(recipe_io.load(make_recipe(tmp_path)), output_dir=run_dir)
    message = str(info.value)
    assert info.value.exit_code == EXIT_FAILED
    assert message == f"loss is {bad} at step 3; last good checkpoint: {run_dir / 'step-000002'}"
    s = summary(run_dir)
    assert s["status"] == "failed" and s["error"] == message
    assert s["steps"] == 3
    assert [p.name for p in checkpoint.list_checkpoints(run_dir)] == ["step-000002"]  # no NaN saved


def test_non_finite_loss_through_the_cli_is_one_line_exit_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    forward = models.TaskModule.forward

    def nan_loss(self, *args, **kwargs):
        loss, logits = forward(self, *args, **kwargs)
        return loss * float("nan"), logits

    monkeypatch.setattr(models.TaskModule, "forward", nan_loss)
    result = CliRunner().invoke(
        app, ["train", str(make_recipe(tmp_path)), "-o", str(tmp_path / "run")]
    )
    assert result.exit_code == EXIT_FAILED
    assert "Traceback" not in result.output
    last = result.stderr.rstrip("\n").splitlines()[-1]
    assert last == "error: loss is nan at step 1"  # no checkpoint yet: none is named


def test_disk_full_while_saving_keeps_the_previous_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENOSPC in the second save: step 2 stays whole, no temp folder is left, one line, exit 1."""
    saves = {"n": 0}
    real_save = torch.save

    def full_disk(obj, f, *args, **kwargs):
        if str(f).endswith("optimizer.pt"):
            saves["n"] += 1
            if saves["n"] == 2:
                raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", full_disk)
    run_dir = tmp_path / "run"
    result = CliRunner().invoke(app, ["train", str(make_recipe(tmp_path)), "-o", str(run_dir)])
    assert result.exit_code == EXIT_FAILED, result.output
    assert "Traceback" not in result.output
    last = result.stderr.rstrip("\n").splitlines()[-1]
    step2 = run_dir / "step-000002"
    assert last == (
        f"error: could not write checkpoint {run_dir / 'step-000004'}: No space left on "
        f"device; the last good checkpoint {step2} is intact"
    )
    assert checkpoint.list_checkpoints(run_dir) == [step2]
    assert checkpoint.verify(step2, deep=True) is None
    assert not [p for p in run_dir.iterdir() if p.name.startswith(".step-")]  # temp dir removed
    s = summary(run_dir)
    assert s["status"] == "failed" and "No space left on device" in s["error"]
    assert s["paths"]["last_checkpoint"] == str(step2)


def test_disk_full_in_safetensors_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The weights file failing first (safetensors) is handled the same way."""
    import safetensors.torch

    calls = {"n": 0}
    real = safetensors.torch.save_file  # checkpoint.save_weights writes through it

    def full_disk(tensors, filename, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(tensors, filename, *args, **kwargs)

    monkeypatch.setattr(safetensors.torch, "save_file", full_disk)
    run_dir = tmp_path / "run"
    with pytest.raises(RunError, match="the last good checkpoint .*step-000002 is intact"):
        train_mod.run(recipe_io.load(make_recipe(tmp_path)), output_dir=run_dir)
    assert checkpoint.latest_good(run_dir) == run_dir / "step-000002"
    assert summary(run_dir)["status"] == "failed"


def test_resaving_the_same_step_never_loses_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A save of a step that already has a checkpoint (a signal right after a periodic save)
    that fails half-way leaves the earlier copy of that step in place."""
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    state = checkpoint.TrainState(step=4, micro_step=4)
    first = checkpoint.save(tmp_path, state, model, opt, sched, "x: 1\n", keep_last=2)

    def failing_swap(src, dst):  # the rename that swaps the new copy in (fsutil.atomic_dir)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fsutil, "_exchange", failing_swap)
    with pytest.raises(RunError, match="No space left on device"):
        checkpoint.save(tmp_path, state, model, opt, sched, "x: 1\n", keep_last=2)
    assert checkpoint.verify(first, deep=True) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000004"]


def test_stale_temp_folders_are_removed(tmp_path):
    from ortft.core import fsutil

    stale = tmp_path / ".step-000004.tmp-12345"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"partial")
    keep = tmp_path / "step-000002"
    keep.mkdir()
    fsutil.remove_stale(tmp_path, ".*.tmp-*")  # what the lifecycle runs at start
    assert not stale.exists() and keep.exists()
