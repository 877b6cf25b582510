"""Preference runs beyond one process on full weights: DPO under torchrun (2 processes on
CPU) gives one process's losses and metrics, and a LoRA run's reference is the base model's
own log-probs (computed before the adapter and ORTModule, never through ORTModule's graph)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import tiny_causal_lm, write_recipe
from helpers import run_cli
from test_preference import write_pairs

TORCHRUN = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
REWARDS = ("rewards_chosen", "rewards_rejected", "reward_accuracy", "reward_margin")


def _rows(run: Path, kind: str) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["kind"] == kind]


def test_two_processes_give_one_process_losses_and_metrics(tmp_path: Path) -> None:
    """torch backend: 2 x 4 pairs a step against one process with 8. The train rows' rewards
    are the global batch's (gathered from both ranks, not rank 0's half), the eval covers every
    eval pair, and both ranks read one reference entry that the single run reads back."""
    write_pairs(tmp_path / "pairs.jsonl", 30)
    r = tiny_causal_lm("pairs.jsonl", backend="torch", max_steps=3, batch_size=4)
    r["task"] = {"name": "preference", "loss": "dpo", "beta": 0.5}
    r["data"].update(eval_fraction=0.2)  # 6 eval pairs: 2 batches of 4 per rank, 1 of 8
    r["export"] = {"enabled": False}
    recipe = write_recipe(tmp_path / "r.yaml", r)
    ddp, single = tmp_path / "ddp", tmp_path / "single"
    res = run_cli("train", recipe, "-o", ddp, launcher=TORCHRUN, env={"NO_COLOR": "1"})
    assert res.returncode == 0, res.stderr[-3000:]
    res = run_cli("train", recipe, "training.batch_size=8", "-o", single, env={"NO_COLOR": "1"})
    assert res.returncode == 0, res.stderr[-3000:]
    # the same base weights and pairs: the two ranks' reference is the one process's
    assert "reference log-probs: 24 train pairs (cache hit)" in res.stderr, res.stderr[-3000:]
    a, b = _rows(ddp, "train"), _rows(single, "train")
    assert [x["step"] for x in a] == [x["step"] for x in b] == [1, 2, 3]
    for x, y in zip(a, b, strict=True):
        assert x["loss"] == pytest.approx(y["loss"], rel=1e-5)
        for name in REWARDS:
            assert x[name] == pytest.approx(y[name], rel=1e-5, abs=1e-7), (name, x, y)
    (ea,), (eb,) = _rows(ddp, "eval"), _rows(single, "eval")
    for name in ("loss", *REWARDS):
        assert ea[name] == pytest.approx(eb[name], rel=1e-5, abs=1e-7), (name, ea, eb)
