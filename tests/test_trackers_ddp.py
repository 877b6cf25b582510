"""Under DDP (torchrun, 2 CPU processes, gloo) global rank 0 alone logs: one MLflow run, one
W&B run, one TensorBoard event file, every step once."""

from __future__ import annotations

import os
from pathlib import Path

from conftest import tiny_classifier, write_classification_csv, write_recipe
from helpers import run_cli, summary
from tracker_readers import OFFLINE, mlflow_client, tensorboard_steps, wandb_history


def test_only_rank_zero_logs_under_ddp(tmp_path: Path) -> None:
    write_classification_csv(tmp_path / "train.csv")
    r = tiny_classifier("train.csv", backend="torch", max_steps=4)
    r["data"]["eval_fraction"] = 0.0
    r["export"] = {"enabled": False}
    r["logging"] = {"trackers": ["tensorboard", "mlflow", "wandb"]}
    path = write_recipe(tmp_path / "r.yaml", r)
    run_dir = tmp_path / "run"
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    res = run_cli(
        "train", path, "--output-dir", run_dir, launcher=launcher, timeout=600,
        base_env={**os.environ, **OFFLINE, "NO_COLOR": "1"},
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert summary(run_dir)["distributed"]["world_size"] == 2
    assert len(list((run_dir / "tensorboard").glob("events.out.tfevents.*"))) == 1
    assert tensorboard_steps(run_dir) == [1, 2, 3, 4]
    client = mlflow_client(run_dir)
    runs = client.search_runs([client.get_experiment_by_name("ortft").experiment_id])
    assert len(runs) == 1
    history = client.get_metric_history(runs[0].info.run_id, "train/loss")
    assert sorted(m.step for m in history) == [1, 2, 3, 4]
    ids, by_step, steps = wandb_history(run_dir)
    assert len(ids) == 1 and len(list((run_dir / "wandb").glob("offline-run-*"))) == 1
    assert steps == [1, 2, 3, 4]
