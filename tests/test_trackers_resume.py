"""One tracker-rich run killed with kill -9 and resumed: TensorBoard, MLflow and W&B (offline)
each hold every step once, in the same tracker run, and nothing secret."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from conftest import tiny_classifier, write_classification_csv, write_recipe
from helpers import run_cli, start_cli, summary
from tracker_readers import OFFLINE, mlflow_client, tensorboard_steps, wandb_history

from ortft.checkpoint import store as checkpoint

STEPS = 24
SECRET = "hf_tracker_test_secret_0123456789"
ENV = {**os.environ, **OFFLINE, "NO_COLOR": "1", "HF_TOKEN": SECRET, "WANDB_API_KEY": SECRET}


def train_rows(run_dir: Path) -> list[dict]:
    """metrics.jsonl's train rows, read while the run writes it: a last line still being
    written is left for the next read."""
    path = run_dir / "metrics.jsonl"
    rows = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            row = json.loads(line)
        except ValueError:
            break
        if row.get("kind") == "train":
            rows.append(row)
    return rows


STOP_AT = 10
# `ortft train` that stops its own process once metrics.jsonl holds step STOP_AT's train row
STOP_AFTER_ROW = f"""
import os, signal, sys
sys.argv = ["ortft", *sys.argv[1:]]
from ortft.run import tracking
write = tracking.Tracker.write
def stopping_write(self, row):
    write(self, row)
    if row.get("kind") == "train" and row["step"] == {STOP_AT}:
        os.kill(os.getpid(), signal.SIGSTOP)
tracking.Tracker.write = stopping_write
from ortft.cli.app import main
main()
"""


def wait_stopped(proc: subprocess.Popen, err: Path, timeout: float = 300) -> None:
    """Until ``proc`` is stopped (state T in /proc/PID/stat); fails if it ends first."""
    deadline = time.monotonic() + timeout
    stat = Path(f"/proc/{proc.pid}/stat")
    while stat.read_text().rsplit(")", 1)[1].split()[0] != "T":
        assert proc.poll() is None, f"the run ended (exit {proc.returncode}):\n{err.read_text()}"
        assert time.monotonic() < deadline, f"the run did not stop within {timeout}s"
        time.sleep(0.02)


def test_kill9_then_resume_continues_the_same_tracker_runs(tmp_path: Path) -> None:
    write_classification_csv(tmp_path / "train.csv")
    recipe = tiny_classifier("train.csv", backend="torch", max_steps=STEPS, eval_every=4)
    recipe["checkpoint"] = {"save_every": 8, "keep_last": 2}
    recipe["logging"] = {
        "trackers": ["tensorboard", "mlflow", "wandb"],
        "experiment": "tiny",
        "tags": {"team": "nlp"},
    }
    path = write_recipe(tmp_path / "r.yaml", recipe)
    run_dir, err = tmp_path / "run", tmp_path / "stderr.txt"
    with open(err, "w") as fh:
        proc = start_cli(
            "train", path, "--output-dir", run_dir, base_env=ENV, stderr=fh, code=STOP_AFTER_ROW
        )
    # The run stops itself (SIGSTOP) right after logging step STOP_AT, past step 8's checkpoint:
    # the rows a live tracker would show twice after the resume. A test that stopped it from
    # outside raced the run: on an idle machine it once finished all 24 steps first.
    try:
        wait_stopped(proc, err)
        assert len(train_rows(run_dir)) == STOP_AT
        # W&B's service is a process of its own: it writes what it was sent (each second,
        # wandb_sink.py) while the run stands still
        deadline = time.monotonic() + 30
        while 8 not in wandb_history(run_dir)[1] and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        # killed on every path: a failed assertion above must not leave a stopped run behind
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL
    last = checkpoint.list_checkpoints(run_dir)[-1]  # what the resume continues from
    killed_ids = json.loads((last / "state.json").read_text())["trackers"]

    res = run_cli("train", path, "--output-dir", run_dir, base_env=ENV, timeout=600)
    assert res.returncode == 0, res.stderr
    assert "resuming from" in res.stderr
    s = summary(run_dir)
    want = list(range(1, STEPS + 1))

    # TensorBoard: the purge at the resumed step leaves each step once
    assert tensorboard_steps(run_dir) == want
    assert tensorboard_steps(run_dir, "eval/accuracy") == [4, 8, 12, 16, 20, 24]

    # MLflow: one run, the one the checkpoint named, every step once, params, tags, artifacts
    client = mlflow_client(run_dir)
    exp = client.get_experiment_by_name("tiny")
    runs = client.search_runs([exp.experiment_id])
    assert (
        [r.info.run_id for r in runs]
        == [killed_ids["mlflow"]]
        == [s["trackers"]["mlflow"]["run_id"]]
    )
    run = runs[0]
    assert run.info.status == "FINISHED"
    history = client.get_metric_history(run.info.run_id, "train/loss")
    assert sorted(m.step for m in history) == want
    assert run.data.params["training.max_steps"] == str(STEPS)
    assert run.data.params["model.from_config.hidden_size"] == "32"
    assert run.data.tags["ortft.recipe_sha256"] == s["provenance"]["recipe_sha256"]
    assert run.data.tags["team"] == "nlp"
    names = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"summary.json", "README.md", "export.json"} <= names

    # W&B offline: every folder carries the stored id, every step once
    ids, by_step, steps = wandb_history(run_dir)
    assert ids == {killed_ids["wandb"]} == {s["trackers"]["wandb"]["run_id"]}
    assert sorted(steps) == sorted(set(steps))
    # a kill -9 loses what W&B had not yet flushed (at most its last second, wandb_sink.py):
    # the steps up to 8 (waited for) and every step after the resumed checkpoint are there
    resumed = int(s["resumed_from"].rsplit("-", 1)[1])
    assert set(range(1, 9)) | set(range(resumed + 1, STEPS + 1)) <= set(by_step) <= set(want)
    assert "eval/accuracy" in by_step[8]

    # nothing secret: the tokens set for the run are in no file any tracker wrote
    for where in ("mlruns", "wandb", "tensorboard"):
        for f in (run_dir / where).rglob("*"):
            assert not f.is_file() or SECRET.encode() not in f.read_bytes(), f
    assert s["trackers"]["warnings"] == []
