"""DDP under torchrun on CPU (gloo, 2 processes): the same losses as one process with the
same global batch, one writer (rank 0), and a resume from a checkpoint written under DDP.

Always in subprocesses: torchrun starts the workers, and ORTModule needs real stdout fds.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import tiny_classifier, write_classification_csv, write_recipe
from helpers import losses, run_cli, summary

from ortft.backends.torch import distributed


def run(*args: str, nproc: int = 1) -> subprocess.CompletedProcess:
    launcher = (
        ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
        if nproc > 1
        else []
    )
    return run_cli("train", *args, launcher=launcher, env={"NO_COLOR": "1"}, timeout=600)


@pytest.fixture
def recipe(tmp_path: Path) -> Path:
    write_classification_csv(tmp_path / "train.csv")
    r = tiny_classifier("train.csv", max_steps=3, batch_size=8)  # dropout 0 (conftest)
    r["data"]["eval_fraction"] = 0.0
    r["export"] = {"enabled": False}
    return write_recipe(tmp_path / "r.yaml", r)


@pytest.mark.ort
def test_two_processes_match_one_with_the_same_global_batch(recipe: Path, tmp_path: Path) -> None:
    """ORT backend: ORTModule wrapped in DDP, 2 x 8 rows per step vs one process with 16 rows."""
    ddp, single = tmp_path / "ddp", tmp_path / "single"
    res = run(str(recipe), "--output-dir", str(ddp), nproc=2)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip() == str(ddp)  # one process (rank 0) prints the result
    res = run(str(recipe), "training.batch_size=16", "--output-dir", str(single))
    assert res.returncode == 0, res.stderr[-3000:]
    a, b = losses(ddp), losses(single)
    assert len(a) == len(b) == 3  # rank 0 alone wrote metrics.jsonl
    # measured: equal to ~6e-8 (the all-reduce sums the two halves in another order)
    assert a == pytest.approx(b, rel=1e-5)
    s = summary(ddp)
    assert s["distributed"] == {"world_size": 2, "backend": "gloo"}
    assert s["backend"]["used"] == "ort" and s["backend"]["fallback"] is False
    assert s["samples"] == summary(single)["samples"] == 48  # 3 steps x global batch 16


def test_ddp_tokenizes_once(recipe: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both processes ask for the same cache entry: the first to take its file lock tokenizes,
    the other waits and reads the same Arrow files (test_data_arrow.py races two processes on
    the lock directly; rank 0 alone logs here)."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("ORTFT_CACHE", str(cache))  # empty: nothing tokenized before
    res = run(str(recipe), "backend.name=torch", "--output-dir", str(tmp_path / "run"), nproc=2)
    assert res.returncode == 0, res.stderr[-3000:]
    logged = res.stderr.count("(tokenized in ") + res.stderr.count("(tokenized earlier: cache hit)")
    assert logged == 1, res.stderr
    assert len([p for p in (cache / "tokenized").iterdir() if p.is_dir()]) == 1


def test_ddp_checkpoints_resume(recipe: Path, tmp_path: Path) -> None:
    """Both ranks resume from rank 0's step-2 checkpoint and follow the uninterrupted run."""
    run_dir = tmp_path / "run"
    args = [
        str(recipe),
        "backend.name=torch",
        "training.max_steps=4",
        "checkpoint.save_every=2",
        "checkpoint.keep_last=3",
        "--output-dir",
        str(run_dir),
    ]
    res = run(*args, nproc=2)
    assert res.returncode == 0, res.stderr[-3000:]
    full = losses(run_dir)
    assert sorted(p.name for p in run_dir.glob("step-*")) == ["step-000002", "step-000004"]
    # make it look like a run killed right after step 2's checkpoint
    for name in ("final", "step-000004", "summary.json"):
        target = run_dir / name
        shutil.rmtree(target) if target.is_dir() else target.unlink()
    res = run(*args, nproc=2)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "resuming from" in res.stderr
    assert summary(run_dir)["resumed_from"].endswith("step-000002")
    assert losses(run_dir) == pytest.approx(full, abs=1e-6)
    assert len(losses(run_dir)) == 4


# Two ranks that leave the exit race of distributed.teardown (its docstring) no room to miss:
# rank 1's last all_reduce is left to its gloo worker (the tensor's Python object dies first,
# rank 0 comes in 1 s later), and rank 1 holds the GIL at the very end of atexit, so a worker
# still alive then frees the tensor during interpreter finalization: SIGABRT ("terminate called
# without an active exception"), as every run did before the fix.
EXIT_RACE = """
import atexit, os, sys, time
if os.environ["RANK"] == "1":  # registered first, runs last: sum() holds the GIL in C (~2 s)
    atexit.register(sum, range(100_000_000))
import torch
from ortft.backends.torch import distributed

def threads():
    return len(os.listdir("/proc/self/task"))

before = threads()
device = distributed.setup(torch.device("cpu"))
ddp = distributed.wrap(torch.nn.Linear(4, 2), device)  # its Reducer holds the group
ddp(torch.ones(3, 4)).sum().backward()
if distributed.rank() == 1:
    t = torch.ones(2)
    work = torch.distributed.all_reduce(t, async_op=True)
    del work, t
else:
    time.sleep(1.0)
    torch.distributed.all_reduce(torch.ones(2))
distributed.teardown()
# one write: torchrun runs python -u, and print's separate newline could interleave the ranks
sys.stdout.write(f"rank {distributed.rank()}: threads {before} before setup, {threads()} after\\n")
"""


def test_teardown_joins_the_group_before_exit(tmp_path: Path) -> None:
    """No thread of the process group outlives teardown, so none can abort the exit."""
    script = tmp_path / "exit_race.py"
    script.write_text(EXIT_RACE)
    res = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
        + [str(script)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    counts = re.findall(r"rank (\d): threads (\d+) before setup, (\d+) after", res.stdout)
    assert sorted(rank for rank, _, _ in counts) == ["0", "1"], res.stdout
    for rank, before, after in counts:  # before the fix: 1 before, 4 after (gloo's 3 threads)
        assert before == after, f"rank {rank}: {before} threads before setup, {after} after"


def test_shard_takes_this_ranks_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy as np

    batch = {"input_ids": np.arange(8).reshape(4, 2), "labels": np.arange(4), "_valid": np.array(4)}
    assert distributed.shard(batch) is batch  # one process: the whole batch
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    part = distributed.shard(batch)
    assert part["input_ids"].tolist() == [[4, 5], [6, 7]] and part["labels"].tolist() == [2, 3]
    assert not distributed.is_main()


def test_nproc_inside_torchrun_is_a_usage_error(recipe: Path) -> None:
    res = run_cli("train", str(recipe), "--nproc", "2", env={"WORLD_SIZE": "2"}, timeout=120)
    assert res.returncode == 2
    assert "--nproc inside torchrun" in res.stderr


@pytest.mark.parametrize(
    ("env", "warns"),
    [
        ({"TORCHELASTIC_MAX_RESTARTS": "3", "TORCHELASTIC_USE_AGENT_STORE": "True"}, True),
        ({"TORCHELASTIC_MAX_RESTARTS": "3", "TORCHELASTIC_USE_AGENT_STORE": "False"}, False),
        ({"TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_USE_AGENT_STORE": "True"}, False),
        ({}, False),
    ],
)
def test_restarts_over_a_shared_store_are_flagged(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], warns: bool
) -> None:
    """torchrun's restarts hang now and then over the store shared across rounds
    (tests/test_multinode.py); the run says how to avoid it."""
    from ortft.backends.torch import distributed

    for key in ("TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_USE_AGENT_STORE"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert distributed._restarts_share_a_store() is warns


def test_bf16_weights_under_ddp_train_like_one_process(recipe: Path, tmp_path: Path) -> None:
    """precision.weights=bf16: DDP wraps the bf16 copy and averages its gradients, which then
    go into each rank's fp32 masters; the two processes agree with one process to bf16's
    precision, and rank 0's final/ holds the fp32 weights."""
    bf16 = ["backend.name=torch", "precision.dtype=bf16", "precision.weights=bf16",
            "training.max_steps=6", "training.lr=1e-2"]  # fmt: skip
    ddp, single = tmp_path / "ddp", tmp_path / "single"
    res = run(str(recipe), *bf16, "--output-dir", str(ddp), nproc=2)
    assert res.returncode == 0, res.stderr[-3000:]
    res = run(str(recipe), *bf16, "training.batch_size=16", "--output-dir", str(single))
    assert res.returncode == 0, res.stderr[-3000:]
    assert summary(ddp)["precision"]["weights"] == "bf16"
    assert summary(ddp)["distributed"]["world_size"] == 2
    # measured 5.6e-4 (bf16 gradients summed in another order); each rank on its own half,
    # unsynchronized, 9e-2
    assert losses(ddp) == pytest.approx(losses(single), rel=5e-3)
