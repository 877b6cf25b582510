"""precision.weights=bf16: a bf16 copy of the model trains, the optimizer steps the fp32 weights
(``ortft/backends/torch/master_weights.py``). The copy's pairing, casts and gradient sums here;
a run's learning, its summary and its exact resume below."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from conftest import tiny_classifier, write_recipe
from helpers import losses, run_cli, summary
from torch import nn

from ortft.backends.torch.master_weights import Bf16Copy


class Tied(nn.Module):
    """Tied embedding and output weights, a trainable and a frozen layer, an fp32 buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(12, 8)
        self.proj = nn.Linear(8, 8)
        self.frozen = nn.Linear(8, 8)
        self.frozen.requires_grad_(False)
        self.out = nn.Linear(8, 12, bias=False)
        self.out.weight = self.embed.weight
        self.register_buffer("scale", torch.tensor(0.3))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):  # as the engine runs a bf16 forward
            hidden = self.frozen(self.proj(self.embed(ids))) * self.scale
            return self.out(hidden).float().logsumexp(-1).mean()


def test_the_copy_is_bf16_but_shares_buffers_and_embedding_tables() -> None:
    torch.manual_seed(0)
    model = Tied()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    bf16 = Bf16Copy(model)
    copy = bf16.copy
    for name, p in model.named_parameters():
        assert p.dtype == torch.float32 and torch.equal(p, before[name])  # the masters stay
    assert copy.proj.weight.dtype == copy.frozen.weight.dtype == torch.bfloat16
    assert torch.equal(copy.proj.weight, model.proj.weight.to(torch.bfloat16))
    assert copy.embed.weight is model.embed.weight  # the table itself, fp32
    assert copy.out.weight is copy.embed.weight  # and the output layer tied to it
    assert copy.scale is model.scale and copy.scale.dtype == torch.float32  # shared, not cast
    assert bf16.masters == [model.proj.weight, model.proj.bias]  # trainable and cast only
    assert copy.embed(torch.tensor([1, 2])).dtype == torch.bfloat16  # cast as it leaves


def test_gradients_add_up_in_fp32_and_updates_reach_the_copy() -> None:
    torch.manual_seed(0)
    model = Tied()
    bf16 = Bf16Copy(model)
    grads = []
    for ids in (torch.tensor([[1, 2, 3]]), torch.tensor([[4, 5, 6, 7]])):  # two micro-batches
        bf16.copy(ids).backward()
        grads.append(bf16.copy.proj.weight.grad.clone())
        bf16.collect_grads()
        assert bf16.copy.proj.weight.grad is None  # moved, not left to add up in bf16
    master = model.proj.weight
    assert master.grad.dtype == torch.float32
    assert torch.equal(master.grad, grads[0].float() + grads[1].float())
    assert model.embed.weight.grad.dtype == torch.float32  # the shared table's, in place
    assert model.frozen.weight.grad is None
    with torch.no_grad():
        master.mul_(1.001)  # an optimizer step
    bf16.update()
    assert torch.equal(bf16.copy.proj.weight, master.to(torch.bfloat16))


def test_a_run_trains_the_copy_keeps_fp32_files_and_resumes_bit_for_bit(tmp_path: Path) -> None:
    from safetensors import safe_open
    from test_batching import _varied_csv

    _varied_csv(tmp_path / "train.csv")
    r = tiny_classifier("train.csv", backend="torch", max_steps=6, batch_size=8)
    r["precision"] = {"dtype": "bf16", "weights": "bf16"}
    r["model"]["dropout"] = 0.1
    r["data"].update(max_length=32, eval_fraction=0.25)
    r["training"]["gradient_accumulation_steps"] = 2  # gradients add up in the fp32 masters
    r["checkpoint"] = {"save_every": 3}
    r["export"] = {"enabled": False}
    recipe, run = write_recipe(tmp_path / "r.yaml", r), tmp_path / "run"
    res = run_cli("train", recipe, "--output-dir", run, env={"NO_COLOR": "1"})
    assert res.returncode == 0, res.stderr[-2000:]
    assert summary(run)["precision"]["weights"] == "bf16"
    with safe_open(str(run / "final" / "model.safetensors"), "pt") as f:
        dtypes = {f.get_slice(k).get_dtype() for k in f.keys()}  # noqa: SIM118 - no __iter__
    assert dtypes == {"F32"}  # the masters, not the copy
    full = losses(run)
    for name in ("final", "step-000006", "summary.json"):  # as if killed after step 3
        target = run / name
        shutil.rmtree(target) if target.is_dir() else target.unlink()
    res = run_cli("train", recipe, "--output-dir", run, env={"NO_COLOR": "1"})
    assert res.returncode == 0, res.stderr[-2000:]
    assert summary(run)["resumed_from"].endswith("step-000003")
    assert losses(run) == full  # the copy is the masters cast, before and after the resume
    res = run_cli("train", recipe, "precision.weights=fp32", "--output-dir", tmp_path / "amp",
                  env={"NO_COLOR": "1"})  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    assert "weights" not in summary(tmp_path / "amp")["precision"]
    assert losses(tmp_path / "amp") != full  # autocast's bf16 is another computation


@pytest.mark.parametrize(
    "overrides, needle",
    [
        (["precision.dtype=fp32"], "precision.weights=bf16 needs precision.dtype bf16 or auto"),
        (["backend.name=ort", "hardware.device=cuda"], "needs backend.name torch (or auto)"),
    ],
)
def test_bf16_weights_outside_a_bf16_torch_run_is_a_recipe_error(
    tmp_path: Path, overrides: list[str], needle: str
) -> None:
    r = tiny_classifier("train.csv", backend="torch")
    r["precision"] = {"dtype": "bf16", "weights": "bf16"}
    recipe = write_recipe(tmp_path / "r.yaml", r)
    res = run_cli("validate", recipe, *[f"--set={o}" for o in overrides])
    assert res.returncode == 2, res.stdout + res.stderr
    assert needle in res.stderr and "Traceback" not in res.stderr
