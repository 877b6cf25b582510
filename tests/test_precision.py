"""Precision (fp32 / bf16 / fp16) and gradient checkpointing: what trains on CPU, what is an error.

Measured on CPU (torch 2.6, onnxruntime-training 1.19.2):
- torch backend: fp32 and bf16 (autocast) train; bf16 follows fp32 to ~1e-2 in the loss.
- ort backend: fp32 trains; bf16 does not (ORT's CPU provider has no bf16 MatMul) -> recipe error.
- fp16 training on CPU -> recipe error (hardware.device=cpu) or run-time error (auto, no GPU).
The CUDA paths (fp16 + GradScaler, bf16 under ORTModule) are in the gpu-marked tests.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import tiny_classifier, write_classification_csv, write_recipe
from typer.testing import CliRunner

from ortft.cli import app

no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")


def train(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ortft", "train", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "NO_COLOR": "1"},
        timeout=600,
        check=False,
    )


def losses(run_dir: Path) -> list[float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if r["kind"] == "train"]


@pytest.fixture
def recipe(tmp_path: Path) -> Path:
    write_classification_csv(tmp_path / "train.csv")
    r = tiny_classifier("train.csv", max_steps=3)
    r["data"]["eval_fraction"] = 0.0
    r["export"] = {"enabled": False}
    return write_recipe(tmp_path / "r.yaml", r)


def validate(recipe: Path, *overrides: str) -> tuple[int, str]:
    res = CliRunner().invoke(app, ["validate", str(recipe), *[f"--set={o}" for o in overrides]])
    return res.exit_code, res.output


def test_precision_matrix_on_cpu(recipe: Path, tmp_path: Path) -> None:
    """fp32 and bf16 on the torch backend, fp32 on the ort backend (+ gradient checkpointing):
    3 steps each, finite losses, close to the fp32 run."""
    runs = {
        "torch-fp32": ["backend.name=torch", "hardware.device=cpu"],
        "torch-bf16": ["backend.name=torch", "hardware.device=cpu", "precision.dtype=bf16"],
        "torch-fp32-ckpt": ["backend.name=torch", "hardware.gradient_checkpointing=true"],
        "ort-fp32": ["backend.name=ort"],
    }
    got = {}
    for name, overrides in runs.items():
        res = train(str(recipe), *overrides, "--output-dir", str(tmp_path / name))
        assert res.returncode == 0, f"{name}: {res.stderr[-3000:]}"
        got[name] = losses(tmp_path / name)
        assert len(got[name]) == 3 and all(math.isfinite(v) for v in got[name]), name
    ref = got["torch-fp32"]
    assert got["ort-fp32"] == pytest.approx(ref, rel=1e-4)  # measured ~1e-7
    assert got["torch-fp32-ckpt"] == pytest.approx(ref, abs=1e-6)  # recompute: the same maths
    # bf16 keeps 8 bits of mantissa: measured within ~1e-2 of fp32 on this model
    assert got["torch-bf16"] == pytest.approx(ref, abs=3e-2)
    summary = json.loads((tmp_path / "torch-bf16" / "summary.json").read_text())
    assert summary["precision"] == {"dtype": "bf16", "skipped_steps": 0}


@pytest.mark.parametrize(
    "overrides, needle",
    [
        (["precision.dtype=fp16", "hardware.device=cpu"], "precision.dtype=fp16 needs CUDA"),
        (["precision.dtype=fp16", "hardware.device=cpu", "backend.name=torch"], "fp16 needs CUDA"),
        (["precision.dtype=bf16", "hardware.device=cpu"], "bf16 on cpu needs backend.name=torch"),
        (["precision.dtype=bf16", "backend.name=ort-ondevice"], "ort-ondevice trains in fp32 only"),
        (["hardware.gradient_checkpointing=true"], "backend.memory_optimization_level"),
    ],
)
def test_unsupported_combinations_are_recipe_errors(
    recipe: Path, overrides: list[str], needle: str
) -> None:
    code, out = validate(recipe, *overrides)
    assert code == 2
    assert needle in out


def test_gpu_precisions_validate_on_a_cpu_machine(recipe: Path) -> None:
    """A recipe that asks for CUDA validates anywhere; it fails at run time without a GPU."""
    for overrides in (
        ["precision.dtype=fp16", "hardware.device=cuda"],
        ["precision.dtype=bf16", "hardware.device=cuda"],
        ["precision.dtype=fp16"],
    ):
        code, out = validate(recipe, *overrides)
        assert code == 0, out


@no_gpu
@pytest.mark.parametrize(
    "overrides, needle",
    [
        (["precision.dtype=fp16"], "precision.dtype=fp16 needs a CUDA GPU"),
        (
            ["precision.dtype=bf16", "backend.name=ort"],
            "ONNX Runtime's CPU provider has no bf16 MatMul",
        ),
    ],
)
def test_auto_device_without_gpu_fails_before_training(
    recipe: Path, tmp_path: Path, overrides: list[str], needle: str
) -> None:
    """hardware.device=auto on a CPU-only machine: a clear error, never a silent fp32 run."""
    res = train(str(recipe), *overrides, "--output-dir", str(tmp_path / "run"))
    assert res.returncode != 0
    assert needle in res.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["torch", "ort"])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_mixed_precision_on_cuda(recipe: Path, tmp_path: Path, backend: str, dtype: str) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    ref, run = tmp_path / "fp32", tmp_path / dtype
    assert (
        train(
            str(recipe), f"backend.name={backend}", "hardware.device=cuda", "--output-dir", str(ref)
        ).returncode
        == 0
    )
    res = train(
        str(recipe),
        f"backend.name={backend}",
        "hardware.device=cuda",
        f"precision.dtype={dtype}",
        "--output-dir",
        str(run),
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert all(math.isfinite(v) for v in losses(run))
    assert losses(run) == pytest.approx(losses(ref), abs=5e-2)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["precision"]["dtype"] == dtype and summary["precision"]["skipped_steps"] >= 0
