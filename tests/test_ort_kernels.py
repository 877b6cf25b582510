"""backend.pytorch_kernels: the PyTorch kernels ORTModule's graph calls for gelu, layer_norm and
cross-entropy compute what PyTorch's autograd computes, and a run reports what was routed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import (
    tiny_causal_lm,
    tiny_classifier,
    write_classification_csv,
    write_corpus,
    write_recipe,
)
from helpers import losses, run_cli

from ortft.backends.ortmodule import kernels as ort_kernels


@pytest.fixture(scope="module")
def ops() -> object:
    ort_kernels._define_library()
    return torch.ops.ortft


def _grads(fn, *inputs: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    leaves = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs]
    out = fn(*leaves)
    out.backward(torch.ones_like(out) if out.dim() else None)
    return out.detach(), [x.grad for x in leaves if x.requires_grad]


def test_resolve() -> None:
    assert ort_kernels.resolve("auto", "cpu") == (
        "gelu", "layer_norm", "cross_entropy", "dropout", "conv", "index_select"
    )  # fmt: skip
    assert ort_kernels.resolve("auto", "cuda") == ()
    assert ort_kernels.resolve([], "cpu") == ()
    assert ort_kernels.resolve(["cross_entropy", "gelu"], "cuda") == ("gelu", "cross_entropy")


def test_gelu_tanh_matches_autograd(ops) -> None:
    torch.manual_seed(0)
    x, g = torch.randn(4, 7, 33), torch.randn(4, 7, 33)
    ref = x.detach().requires_grad_()
    torch.nn.functional.gelu(ref, approximate="tanh").backward(g)
    torch.testing.assert_close(
        ops.gelu_tanh(x), torch.nn.functional.gelu(x, approximate="tanh"), rtol=0, atol=0
    )
    torch.testing.assert_close(ops.gelu_tanh_backward(g, x), ref.grad, rtol=1e-6, atol=1e-7)


def test_layer_norm_matches_autograd(ops) -> None:
    torch.manual_seed(0)
    x, w, b, g = torch.randn(3, 5, 16), torch.randn(16), torch.randn(16), torch.randn(3, 5, 16)
    leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    torch.nn.functional.layer_norm(leaves[0], (16,), leaves[1], leaves[2], 1e-5).backward(g)
    out, mean, rstd = ops.layer_norm(x, w, b, 1e-5)
    torch.testing.assert_close(out, torch.nn.functional.layer_norm(x, (16,), w, b, 1e-5))
    dx, dw, db = ops.layer_norm_backward(g, x, mean, rstd, w, b)
    for mine, ref in zip((dx, dw, db), leaves, strict=True):
        torch.testing.assert_close(mine, ref.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("ignored", [0, 5])
def test_cross_entropy_matches_autograd(ops, ignored: int) -> None:
    """Mean over the rows that count; ignore_index rows get no gradient (HF's -100 labels)."""
    torch.manual_seed(0)
    logits, target = torch.randn(12, 9), torch.randint(0, 9, (12,))
    target[:ignored] = -100
    ref = logits.clone().requires_grad_()
    loss_ref = torch.nn.functional.cross_entropy(ref, target, ignore_index=-100)
    loss_ref.backward(torch.tensor(0.5))
    loss, log_probs = ops.cross_entropy(logits, target, -100)
    torch.testing.assert_close(loss, loss_ref.detach())
    grad = ops.cross_entropy_backward(torch.tensor(0.5), log_probs, target, -100)
    torch.testing.assert_close(grad, ref.grad, rtol=1e-5, atol=1e-7)
    assert grad[:ignored].abs().sum() == 0


@pytest.mark.parametrize(("stride", "padding", "groups"), [(1, 1, 1), (2, 1, 1), (1, 0, 2)])
def test_conv2d_matches_autograd(ops, stride: int, padding: int, groups: int) -> None:
    """The UNet's 3x3 convolutions (stride 1, and 2 in its downsamplers), a 1x1 shortcut, and
    a grouped one: the output and all three gradients are PyTorch's own."""
    torch.manual_seed(0)
    x, w, b = torch.randn(3, 4, 9, 9), torch.randn(6, 4 // groups, 3, 3), torch.randn(6)
    args = ([stride] * 2, [padding] * 2, [1, 1], groups)
    leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    ref = torch.nn.functional.conv2d(*leaves, stride, padding, 1, groups)
    g = torch.randn_like(ref)
    ref.backward(g)
    torch.testing.assert_close(ops.conv2d(x, w, b, *args), ref.detach(), rtol=0, atol=0)
    for mine, leaf in zip(ops.conv2d_backward(g, x, w, *args), leaves, strict=True):
        torch.testing.assert_close(mine, leaf.grad, rtol=1e-6, atol=1e-6)


class _ConvNet(torch.nn.Module):
    """conv_in on the model's input (ORT's Conv: no input gradient to give), a strided conv
    and a 1x1 conv with SiLU between (routed), as in a UNet's ResNet block, and between them a
    squeeze-excitation whose two 1x1 convs (routed) see a 1x1 map that is multiplied back onto
    the 5x5 one (RegNet's: its gradient must be summed over the 5x5)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv_in = torch.nn.Conv2d(4, 8, 3, padding=1)
        self.down = torch.nn.Conv2d(8, 8, 3, stride=2, padding=1)
        self.squeeze = torch.nn.Conv2d(8, 2, 1)
        self.excite = torch.nn.Conv2d(2, 8, 1)
        self.out = torch.nn.Conv2d(8, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.silu(self.down(self.conv_in(x)))
        se = self.excite(torch.relu(self.squeeze(h.mean((2, 3), keepdim=True))))
        return self.out(h * torch.sigmoid(se))


@pytest.mark.ort
@pytest.mark.parametrize("kernels", [["conv"], []])
def test_routed_conv_trains_as_pytorch_does(tmp_path: Path, monkeypatch, kernels) -> None:
    """ORTModule with convolutions routed to PyTorch's kernels ([conv]) and with ORT's ([]):
    the outputs and gradients are eager PyTorch's; the graph holds 4 routed convolutions."""
    import copy

    from ortft.backends.ortmodule.wrapper import OrtBackend
    from ortft.recipe.schema import BackendSection

    monkeypatch.setenv("ORTMODULE_FALLBACK_POLICY", "FALLBACK_DISABLE")
    torch.manual_seed(0)
    eager = _ConvNet()
    backend = OrtBackend(BackendSection(name="ort", pytorch_kernels=kernels))
    ort = backend.wrap(copy.deepcopy(eager), tmp_path)
    x = torch.randn(3, 4, 9, 9)
    outs = [m(x) for m in (eager, ort)]
    for out in outs:
        out.square().sum().backward()
    backend.after_step(ort)
    assert backend.report().pytorch_kernels == ({"conv": 4} if kernels else {})
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-5, atol=1e-6)
    for (name, p_eager), (_, p_ort) in zip(
        eager.named_parameters(), ort.named_parameters(), strict=True
    ):
        torch.testing.assert_close(p_ort.grad, p_eager.grad, rtol=1e-5, atol=1e-5, msg=name)


def test_dropout_masks_follow_the_seed_and_the_micro_step(ops) -> None:
    """Each element kept with probability 1 - p and scaled by 1 / (1 - p); the gradient is the
    mask's; the same (seed, micro-step) draws the same mask, the next micro-step another."""
    x, g, p = torch.randn(64, 512), torch.randn(64, 512), 0.25
    ort_kernels.reseed(42, 3)
    out, mask = ops.dropout(x, p)
    kept = mask != 0
    assert mask.unique().tolist() == pytest.approx([0.0, 1 / (1 - p)])
    assert abs(kept.float().mean().item() - (1 - p)) < 0.01  # 32,768 draws
    torch.testing.assert_close(out, torch.where(kept, x / (1 - p), 0.0), rtol=1e-6, atol=0)
    torch.testing.assert_close(ops.dropout_backward(g, mask), torch.where(kept, g / (1 - p), 0.0))
    ort_kernels.reseed(42, 3)
    assert torch.equal(ops.dropout(x, p)[1], mask)  # a resumed run draws what it drew
    ort_kernels.reseed(42, 4)
    assert not torch.equal(ops.dropout(x, p)[1], mask)


@pytest.mark.ort
def test_dropout_runs_as_a_pytorch_kernel_only_when_it_drops(tmp_path: Path) -> None:
    """Dropout 0.1 in training: routed (ORT's CPU Dropout cost MiniLM 29% of a step); dropout
    0 keeps the export ORTModule always had. Two runs with the same seed: the same losses."""
    write_classification_csv(tmp_path / "train.csv")
    path = write_recipe(tmp_path / "cls.yaml", tiny_classifier("train.csv", max_steps=3))
    common = (str(path), "export.enabled=false", "data.eval_fraction=0", "model.dropout=0.1")
    a = _train(*common, "-o", str(tmp_path / "a"))
    _train(*common, "-o", str(tmp_path / "b"))
    # 2 layers x 3 dropouts (attention probabilities, attention output, MLP output), the
    # embeddings' and the classifier's
    assert a["backend"]["pytorch_kernels"]["dropout"] == 8
    assert losses(tmp_path / "a") == losses(tmp_path / "b")
    off = _train(str(path), "export.enabled=false", "data.eval_fraction=0", "-o",
                 str(tmp_path / "c"))  # fmt: skip
    assert "dropout" not in off["backend"]["pytorch_kernels"]


def test_fuse_tanh_gelu_is_the_same_function() -> None:
    """GPT-2's NewGELUActivation (the tanh formula in Python ops) -> gelu(approximate=tanh)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from ortft.backends.torch import fusions

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=50))
    act = model.transformer.h[0].mlp.act
    assert type(act).__name__ == "NewGELUActivation"
    x = torch.randn(2, 8, 128) * 3
    before = act(x)
    assert fusions.fuse_tanh_gelu(model) == 2
    assert isinstance(model.transformer.h[0].mlp.act, fusions.TanhGelu)
    torch.testing.assert_close(model.transformer.h[0].mlp.act(x), before, rtol=1e-6, atol=1e-6)
    assert fusions.fuse_tanh_gelu(model) == 0


def test_bad_kernel_name_is_a_recipe_error(cls_recipe: Path) -> None:
    res = run_cli(
        "validate", str(cls_recipe), "backend.pytorch_kernels=[gelu,softmax]", timeout=None
    )
    assert res.returncode == 2
    assert "backend.pytorch_kernels" in res.stderr
    assert "Traceback" not in res.stderr


def _train(*args: str, env: dict[str, str] | None = None) -> dict:
    res = run_cli("train", *args, "--json", env={"NO_COLOR": "1", **(env or {})}, timeout=600)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


@pytest.mark.ort
def test_routed_and_unrouted_runs_agree(tmp_path: Path) -> None:
    """The same GPT-2 run with ORT's kernels ([]) and with PyTorch's (auto): the same losses;
    the summary says which ops ran as PyTorch kernels and with which thread settings."""
    write_corpus(tmp_path / "corpus.txt")
    path = write_recipe(tmp_path / "lm.yaml", tiny_causal_lm("corpus.txt"))
    common = ("export.enabled=false", "data.eval_fraction=0")
    routed = _train(str(path), *common, "-o", str(tmp_path / "a"))
    plain = _train(
        str(path),
        *common,
        "backend.pytorch_kernels=[]",
        "-o",
        str(tmp_path / "b"),
        env={"GOMP_SPINCOUNT": "5000"},
    )
    # index_select: the gather of the labelled positions' hidden states (ortft.tasks.lm_head)
    routed_ops = {"gelu": 2, "layer_norm": 5, "cross_entropy": 1, "index_select": 1}
    assert routed["backend"]["pytorch_kernels"] == routed_ops
    assert routed["backend"]["used"] == "ort" and not routed["backend"]["fallback"]
    assert "GOMP_SPINCOUNT=1000" in routed["backend"]["notes"]
    assert "ORTFT_ORT_SPINNING=0" in routed["backend"]["notes"]
    assert plain["backend"]["pytorch_kernels"] == {}
    assert "GOMP_SPINCOUNT=5000" in plain["backend"]["notes"]  # the user's setting wins
    assert losses(tmp_path / "a") == pytest.approx(losses(tmp_path / "b"), rel=1e-5)


@pytest.mark.ort
def test_frozen_layers_keep_ort_layer_norm(tmp_path: Path) -> None:
    """backend.trainable freezes the embeddings: a LayerNorm input may then need no gradient,
    which the routed LayerNorm gradient cannot express, so ORT keeps its own LayerNorm."""
    write_classification_csv(tmp_path / "train.csv")
    recipe = tiny_classifier("train.csv")
    recipe["backend"]["trainable"] = ["classifier.*", "bert.encoder.layer.1.*"]
    path = write_recipe(tmp_path / "cls.yaml", recipe)
    s = _train(str(path), "export.enabled=false", "-o", str(tmp_path / "run"))
    kernels = s["backend"]["pytorch_kernels"]
    assert "layer_norm" not in kernels
    assert kernels.get("cross_entropy") == 1
    assert s["backend"]["used"] == "ort" and s["status"] == "completed"
