"""Precision (fp32 / bf16 / fp16) and gradient checkpointing: what trains on CPU, what is an error.

Measured on CPU (torch 2.6, onnxruntime-training 1.19.2):
- torch backend: fp32 and bf16 (autocast) train; bf16 follows fp32 to ~1e-2 in the loss.
- ort backend: fp32 trains; bf16 does not (ORT's CPU provider has no bf16 MatMul) -> recipe error.
- fp16 training on CPU -> recipe error (hardware.device=cpu) or run-time error (auto, no GPU).
The CUDA paths (fp16 + GradScaler, bf16 under ORTModule) are in the gpu-marked tests. The fp16
step itself (skip on overflow, count it, keep the scheduler, checkpoint the scaler) is tested on
CPU with ``torch.amp.GradScaler("cpu")`` and an injected inf gradient.
"""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import (
    OVERFIT_STEPS,
    assert_falls_like,
    overfit_classifier,
    tiny_classifier,
    write_classification_csv,
    write_recipe,
)
from helpers import losses, run_cli
from typer.testing import CliRunner

from ortft.backends.torch import amp, eager
from ortft.cli.app import app
from ortft.core.errors import InputError

no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")


def train(*args: str) -> subprocess.CompletedProcess:
    return run_cli("train", *args, env={"NO_COLOR": "1"}, timeout=600)


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


TORCH_FP32 = ["backend.name=torch", "hardware.device=cpu"]


def _overfit(tmp_path: Path, runs: dict[str, list[str]]) -> dict[str, list[float]]:
    """Each run's losses on one batch overfit for OVERFIT_STEPS steps, all finite."""
    recipe = write_recipe(tmp_path / "r.yaml", overfit_classifier(tmp_path))
    got = {}
    for name, overrides in runs.items():
        res = train(str(recipe), *overrides, "--output-dir", str(tmp_path / name))
        assert res.returncode == 0, f"{name}: {res.stderr[-3000:]}"
        got[name] = losses(tmp_path / name)
        assert len(got[name]) == OVERFIT_STEPS, name
        assert all(math.isfinite(v) for v in got[name]), name
    return got


def test_precision_matrix_on_cpu(tmp_path: Path) -> None:
    """fp32 and bf16 on the torch backend (+ gradient checkpointing), on one batch overfit for
    10 steps: finite losses; the fp32 route equals the fp32 run, and bf16's loss falls like
    fp32's, with fp32 weights under autocast and with a bf16 copy (precision.weights=bf16) (a
    bf16 step that left the weights alone would stay at ln 2)."""
    got = _overfit(
        tmp_path,
        {
            "torch-fp32": TORCH_FP32,
            "torch-bf16": [*TORCH_FP32, "precision.dtype=bf16"],
            "torch-bf16w": [*TORCH_FP32, "precision.dtype=bf16", "precision.weights=bf16"],
            "torch-fp32-ckpt": ["backend.name=torch", "hardware.gradient_checkpointing=true"],
        },
    )
    ref = got["torch-fp32"]
    assert got["torch-fp32-ckpt"] == pytest.approx(ref, abs=1e-6)  # recompute: the same maths
    # bf16 keeps 8 bits of mantissa: measured 0.425 against fp32's 0.401 (0.693 -> 0.292)
    assert_falls_like(ref, got["torch-bf16"], share=0.8)
    # a bf16 copy trained, the fp32 weights stepped (master_weights.py): falls like fp32 too
    assert_falls_like(ref, got["torch-bf16w"], share=0.8)
    summary = json.loads((tmp_path / "torch-bf16" / "summary.json").read_text())
    assert summary["precision"] == {"dtype": "bf16", "skipped_steps": 0}
    # bf16 on CPU trains with eager attention (eager.attention), fp32 with transformers' sdpa
    assert eager.EAGER_ON_CPU_BF16 in summary["backend"]["notes"]
    fp32 = json.loads((tmp_path / "torch-fp32" / "summary.json").read_text())
    assert not any("attention" in note for note in fp32["backend"]["notes"])


@pytest.mark.ort
def test_ort_fp32_on_cpu_equals_torch_fp32(tmp_path: Path) -> None:
    """The precision matrix's ort row: fp32 on the ort backend, the same overfit batch."""
    got = _overfit(tmp_path, {"torch-fp32": TORCH_FP32, "ort-fp32": ["backend.name=ort"]})
    assert got["ort-fp32"] == pytest.approx(got["torch-fp32"], rel=1e-4)  # measured ~1e-7


def test_the_torch_route_picks_its_attention(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.delenv("ORTFT_TORCH_ATTN", raising=False)
    assert eager.attention(cpu, "bf16") == ("eager", eager.EAGER_ON_CPU_BF16)
    assert eager.attention(cpu, "fp32") == ("sdpa", None)
    assert eager.attention(cuda, "bf16") == ("sdpa", None)  # not measured: the default
    monkeypatch.setenv("ORTFT_TORCH_ATTN", "sdpa")  # a bench variant fixes it either way
    assert eager.attention(cpu, "bf16") == ("sdpa", "attention=sdpa (ORTFT_TORCH_ATTN)")
    monkeypatch.setenv("ORTFT_TORCH_ATTN", "flash")
    with pytest.raises(InputError, match="ORTFT_TORCH_ATTN=flash"):  # one line, exit 2
        eager.attention(cpu, "fp32")


@pytest.mark.parametrize(
    "overrides, needle",
    [
        (["precision.dtype=fp16", "hardware.device=cpu"], "precision.dtype=fp16 needs CUDA"),
        (["precision.dtype=fp16", "hardware.device=cpu", "backend.name=torch"], "fp16 needs CUDA"),
        pytest.param(
            ["precision.dtype=bf16", "hardware.device=cpu"],
            "bf16 on cpu needs backend.name=torch",
            marks=pytest.mark.ort,  # the recipe's backend is ort on the ort profile only
        ),
        (["precision.dtype=bf16", "backend.name=ort-ondevice"], "ort-ondevice trains in fp32 only"),
        pytest.param(
            ["hardware.gradient_checkpointing=true"],
            "backend.memory_optimization_level",
            marks=pytest.mark.ort,  # ORTModule's recompute
        ),
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
        pytest.param(
            ["precision.dtype=bf16", "backend.name=ort"],
            "ONNX Runtime's CPU provider has no bf16 MatMul",
            marks=pytest.mark.ort,
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
    precision = json.loads((run / "summary.json").read_text())["precision"]
    assert precision["dtype"] == dtype
    # bf16 runs without a scaler, so nothing can be skipped; fp16 may skip a first step while
    # the scale (65536) comes down, never all three (the CPU tests below pin the counting)
    if dtype == "bf16":
        assert precision["skipped_steps"] == 0
    else:
        assert precision["skipped_steps"] < 3


# --------------------------------------------------------------------------- fp16 loss scaling


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_an_fp16_overflow_skips_that_step_only_and_is_counted(device: str) -> None:
    """Step 2 of 3 gets an inf gradient: exactly that step is skipped (weights kept, scheduler
    not advanced, scale halved), the count is 1, and the steps around it apply normally."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1).to(device)
    params = list(model.parameters())
    optimizer = torch.optim.SGD(params, lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    # a small scale (16) so that the scaled gradients differ from the true ones by 16x
    scaler = torch.amp.GradScaler(device, init_scale=16.0, growth_interval=1000)
    x = torch.ones(2, 4, device=device)
    applied, skipped, moved, scales, epochs = [], 0, [], [], []
    for step in range(3):
        before = torch.cat([p.detach().flatten() for p in params]).clone()
        scaler.scale(model(x).sum()).backward()
        if step == 1:  # what an fp16 overflow looks like to the scaler
            params[0].grad[0, 0] = float("inf")
        ok = amp.optimizer_step(optimizer, scheduler, scaler, params, max_grad_norm=1.0)
        skipped += not ok  # how the loop counts summary.precision.skipped_steps
        applied.append(ok)
        moved.append(float((torch.cat([p.detach().flatten() for p in params]) - before).norm()))
        scales.append(scaler.get_scale())
        epochs.append(scheduler.last_epoch)
        assert all(p.grad is None for p in params)  # zeroed (set to None) either way
    assert applied == [True, False, True] and skipped == 1
    assert scales == [16.0, 8.0, 8.0]
    assert epochs == [1, 1, 2]  # the skipped step did not advance the schedule
    # the true gradient's norm is sqrt(20) > 1: clipped to 1 *after* unscaling, so the update is
    # lr * 1 (0.1, then 0.05: the skipped step left the lr at its second value, not 0.1 / 3);
    # clipping the scaled gradients would have moved the weights 16x less
    assert moved[0] == pytest.approx(0.1, rel=1e-5)
    assert moved[1] == 0.0
    assert moved[2] == pytest.approx(0.05, rel=1e-5)


@pytest.mark.parametrize("max_norm", [0.5, 1e6])  # clipped; above the norm: not clipped
def test_the_fused_adamw_step_clips_as_clip_grad_norm_does(
    max_norm: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With torch's fused AdamW and no scaler, the clipping factor goes to the fused step
    (amp.fold_clip): three steps move the weights as clip_grad_norm_ then the step does, to
    fp32 rounding (a division by the factor's inverse instead of a product), without a pass
    of clip_grad_norm_ over the gradients, and leave no grad_scale on the optimizer."""

    def run(fold: bool) -> torch.Tensor:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 1))
        params = list(model.parameters())
        optimizer = torch.optim.AdamW(params, lr=0.1, eps=1.0, fused=True)  # eps: scale-sensitive
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
        scaler = torch.amp.GradScaler("cpu", enabled=False)
        for _ in range(3):
            (model(torch.randn(4, 8)) * 30).pow(2).mean().backward()
            if fold:
                assert amp.folds_clip(optimizer, scaler)
                assert amp.optimizer_step(optimizer, scheduler, scaler, params, max_norm)
                assert "grad_scale" not in vars(optimizer)
            else:
                torch.nn.utils.clip_grad_norm_(params, max_norm)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
        return torch.cat([p.detach().flatten() for p in params])

    clipped = run(fold=False)
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", lambda *a, **k: pytest.fail("a pass"))
    torch.testing.assert_close(run(fold=True), clipped, rtol=1e-6, atol=1e-7)


def test_without_a_fused_step_the_gradients_are_clipped_before_it() -> None:
    """An optimizer without the fused kernel (SGD here, foreach AdamW), or a running scaler,
    does not take the factor: clip_grad_norm_ clips the gradients before the step."""
    param = torch.nn.Parameter(torch.zeros(3))
    off = torch.amp.GradScaler("cpu", enabled=False)
    assert not amp.folds_clip(torch.optim.AdamW([param], foreach=True), off)
    assert not amp.folds_clip(torch.optim.AdamW([param], fused=True), torch.amp.GradScaler("cpu"))
    sgd = torch.optim.SGD([param], lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(sgd, lambda step: 1.0)
    param.grad = torch.tensor([30.0, 40.0, 0.0])  # norm 50, clipped to 1
    assert amp.optimizer_step(sgd, scheduler, off, [param], 1.0)
    torch.testing.assert_close(param.detach(), torch.tensor([-0.6, -0.8, 0.0]))


def _scaler_step(scaler: torch.amp.GradScaler, overflow: bool = False) -> bool:
    """One optimizer step of a throwaway model under ``scaler`` (optionally overflowing)."""
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    scaler.scale(model(torch.ones(1, 2)).sum()).backward()
    if overflow:
        model.weight.grad[0, 0] = float("inf")
    return amp.optimizer_step(optimizer, scheduler, scaler, list(model.parameters()), None)


def test_grad_scaler_state_survives_a_checkpoint(tmp_path: Path) -> None:
    """scale and growth tracker through torch.save / torch.load(weights_only=True): the resumed
    scaler is where the first one was, and grows on the same step."""
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=3)
    assert [_scaler_step(scaler, o) for o in (False, True, False, False)] == [1, 0, 1, 1]
    assert scaler.get_scale() == 512.0 and scaler.state_dict()["_growth_tracker"] == 2
    torch.save({"scaler": amp.scaler_state(scaler)}, tmp_path / "state.pt")
    state = torch.load(tmp_path / "state.pt", weights_only=True)["scaler"]
    resumed = torch.amp.GradScaler("cpu")  # a new process: the default scale, 65536
    amp.load_scaler_state(resumed, state)
    assert resumed.get_scale() == 512.0
    assert resumed.state_dict() == scaler.state_dict()
    # the third good step since the overflow doubles the scale, in both
    assert _scaler_step(scaler) and _scaler_step(resumed)
    assert scaler.get_scale() == resumed.get_scale() == 1024.0


def test_a_disabled_scaler_checkpoints_nothing_and_loads_anything() -> None:
    """fp32 / bf16: no scaler state; resuming an fp16 checkpoint as fp32 (or the reverse) is
    not an error, and a fresh fp16 scaler given {} keeps its default scale."""
    off = torch.amp.GradScaler("cpu", enabled=False)
    assert amp.scaler_state(off) == {}
    amp.load_scaler_state(off, {"scale": 8.0, "_growth_tracker": 1})
    on = torch.amp.GradScaler("cpu")
    amp.load_scaler_state(on, amp.scaler_state(off))
    amp.load_scaler_state(on, None)
    assert on.get_scale() == 65536.0
    assert _scaler_step(off)  # disabled: every step applies


def test_checkpoints_carry_the_fp16_scaler_state(tmp_path: Path) -> None:
    """checkpoint.save keeps the GradScaler's state (scaler.pt) and load gives it back; an
    fp32/bf16 run (a disabled scaler: {}) writes no scaler.pt."""
    from ortft.backends.torch import amp
    from ortft.checkpoint import store as checkpoint

    model = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    scaler = torch.amp.GradScaler("cpu", init_scale=512.0)
    state = checkpoint.TrainState(step=3)
    path = checkpoint.save(
        tmp_path, state, model, opt, sched, "{}\n", 2, scaler=amp.scaler_state(scaler)
    )
    assert (path / "scaler.pt").exists() and checkpoint.verify(path, deep=True) is None
    fresh = torch.amp.GradScaler("cpu")
    amp.load_scaler_state(fresh, checkpoint.load(path, model).scaler)
    assert fresh.get_scale() == 512.0
    state.step = 4
    off = torch.amp.GradScaler("cpu", enabled=False)
    path = checkpoint.save(
        tmp_path, state, model, opt, sched, "{}\n", 2, scaler=amp.scaler_state(off)
    )
    assert not (path / "scaler.pt").exists() and checkpoint.load(path, model).scaler is None
