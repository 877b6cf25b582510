"""One tracker-rich run killed with kill -9 and resumed: TensorBoard, MLflow and W&B (offline)
each hold every step once, in the same tracker run, and nothing secret."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from conftest import tiny_classifier, write_classification_csv, write_recipe
from helpers import run_cli, start_cli, summary
from test_interrupt import wait_for
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
        proc = start_cli("train", path, "--output-dir", run_dir, base_env=ENV, stderr=fh)
    wait_for(run_dir / "step-000008" / checkpoint.MANIFEST, proc, err)
    # Stopped (SIGSTOP) at the first rows past the checkpoint, the rows a live tracker would
    # show twice after the resume, then killed. Not killed while running: on an idle machine
    # the run once finished its 24 steps while the test waited for W&B's flush, and the
    # "resume" found a finished run (the cold CI of 2026-12-01).
    try:
        deadline = time.monotonic() + 120
        while len(train_rows(run_dir)) <= 8 and proc.poll() is None:
            if time.monotonic() > deadline:
                break
            time.sleep(0.002)
        proc.send_signal(signal.SIGSTOP)
        assert proc.poll() is None, "the run ended before it could be stopped"
        assert 8 < len(train_rows(run_dir)) < STEPS
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
