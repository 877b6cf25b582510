"""The vision fixes of backends/ortmodule/patches.py, each on the smallest module that shows
what ORTModule gets wrong without it: gradients against eager PyTorch's (the pooling and
padding fixes: ORT is silently wrong), a gradient at all (Hardswish), or the resize the traced
graph no longer holds (DINOv2, BEiT: ORT cannot run it). The families themselves train in the
architecture tier (tests/test_archs.py)."""

from __future__ import annotations

import copy
import io

import onnx
import pytest
import torch
from torch import nn

from ortft.backends.ortmodule import patches

pytestmark = pytest.mark.ort  # the patches make vision layers train through ORTModule

TOL = 1e-5  # relative, of a gradient's largest element


class SqueezeExcite(nn.Module):
    """RegNet's SE layer: a 1x1 pool whose output gates the input it pooled."""

    def __init__(self, channels: int = 16) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, channels, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d((1, 1))
        self.gate = nn.Sequential(nn.Conv2d(channels, 4, 1), nn.ReLU(), nn.Conv2d(4, channels, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv(x)
        return (h * torch.sigmoid(self.gate(self.pool(h)))).square().mean()


class SamePadding(nn.Module):
    """EfficientNet's depthwise convolution (padding="same") and a pointwise one."""

    def __init__(self) -> None:
        super().__init__()
        self.depthwise = nn.Conv2d(4, 4, 5, padding="same", groups=4)
        self.pointwise = nn.Conv2d(4, 8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pointwise(self.depthwise(x)).square().mean()


class HardActivations(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.swish, self.sigmoid = nn.Hardswish(), nn.Hardsigmoid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x * 4)  # |x| > 3 too: both ends of the clamp
        return (self.swish(h) * self.sigmoid(h)).sum()


def _ort_grads(module: nn.Module, x: torch.Tensor, monkeypatch) -> dict[str, torch.Tensor]:
    """The gradients of ``module(x)`` through ORTModule, PyTorch fallback off."""
    monkeypatch.setenv("ORTMODULE_FALLBACK_POLICY", "FALLBACK_DISABLE")
    monkeypatch.setenv("ORTMODULE_LOG_LEVEL", "ERROR")
    from onnxruntime.training.ortmodule import ORTModule

    ORTModule(module)(x).backward()
    return {n: p.grad for n, p in module.named_parameters()}


def _worst(eager: nn.Module, x: torch.Tensor, grads: dict[str, torch.Tensor]) -> float:
    eager(x).backward()
    return max(
        float((p.grad - grads[n]).abs().max() / p.grad.abs().max())
        for n, p in eager.named_parameters()
    )


def test_a_1x1_adaptive_pool_exports_as_global_average_pool_and_its_gradients_are_right(
    monkeypatch,
) -> None:
    torch.manual_seed(0)
    eager, x = SqueezeExcite(), torch.randn(4, 3, 8, 8)
    module = copy.deepcopy(eager)
    assert patches.vision_patches(module) == [
        "patch: 1x1 adaptive_avg_pool2d -> GlobalAveragePool (not ATen)"
    ]
    assert patches.global_average_pool(module)  # again: idempotent
    # unpatched: the gate's bias gradients 2.5e-3, 6.6e-7, 1.5e-10 for 1.1e-2, 1.6e-2, 1.9e-2
    assert _worst(eager, x, _ort_grads(module, x, monkeypatch)) < TOL
    assert not patches.global_average_pool(nn.Linear(2, 2))  # no pool: nothing installed


def test_same_padding_becomes_explicit_and_its_gradients_are_right(monkeypatch) -> None:
    torch.manual_seed(0)
    eager, x = SamePadding(), torch.randn(2, 4, 8, 8)
    module = copy.deepcopy(eager)
    assert patches.explicit_same_padding(module) == (1, 0)
    assert module.depthwise.padding == (2, 2)
    with torch.no_grad():  # the same convolution
        assert torch.equal(module(x), eager(x))
    # unpatched: ConvGrad ignores auto_pad=SAME_UPPER (the depthwise weight's gradient off)
    assert _worst(eager, x, _ort_grads(module, x, monkeypatch)) < TOL
    even = nn.Conv2d(2, 2, 4, padding="same")  # torch pads it 1 before, 2 after: left as is
    assert patches.explicit_same_padding(even) == (0, 1) and even.padding == "same"


def test_hardswish_trains_on_ort_with_torchs_gradients(monkeypatch) -> None:
    torch.manual_seed(0)
    eager, x = HardActivations(), torch.randn(4, 8)
    module = copy.deepcopy(eager)
    assert patches.elementary_hardswish(module) == 2
    with torch.no_grad():
        assert torch.allclose(module(x), eager(x), rtol=1e-6, atol=0)
    # unpatched: "The gradient builder has not been registered: HardSwish"
    assert _worst(eager, x, _ort_grads(module, x, monkeypatch)) < TOL


def _tiny(model_type: str, **options: object) -> nn.Module:
    from transformers import AutoConfig, AutoModel

    config = AutoConfig.for_model(
        model_type, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        image_size=16, patch_size=4, **options,
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModel.from_config(config, attn_implementation="eager").eval()
    for p in model.parameters():  # BEiT's bias table starts at zero: make it count
        nn.init.normal_(p, std=0.5)
    return model


def _resizes(model: nn.Module, x: torch.Tensor) -> int:
    buf = io.BytesIO()
    # no constant folding: ORTModule exports parameters as inputs, which a fold cannot take
    torch.onnx.export(model, (x,), buf, dynamo=False, do_constant_folding=False)
    nodes = onnx.load_from_string(buf.getvalue()).graph.node
    # ORTModule's symbolics (process-wide once one is built) make it an ATen upsample
    return sum(n.op_type == "Resize" or b"upsample" in n.SerializeToString() for n in nodes)


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
@pytest.mark.parametrize(
    ("model_type", "options"),
    [("dinov2", {"mlp_ratio": 2}), ("beit", {"use_relative_position_bias": True})],
    ids=["dinov2", "beit"],
)
def test_position_tables_are_not_resized_to_their_own_size(model_type, options) -> None:
    """The traced graph loses the identity Resize (ORT: no shape inference through DINOv2's,
    no ResizeGrad for BEiT's) and the model computes what it did, eager and traced."""
    model, x = _tiny(model_type, **options), torch.randn(2, 3, 16, 16)
    patched = copy.deepcopy(model)
    assert patches.static_position_embeddings(patched) == 1
    assert patches.static_position_embeddings(patched) == 0  # once
    assert _resizes(model, x) == 1 and _resizes(patched, x) == 0
    with torch.no_grad():
        want = model(pixel_values=x).last_hidden_state
        assert torch.equal(patched(pixel_values=x).last_hidden_state, want)
        traced = torch.jit.trace(patched, (x,), strict=False)
        assert torch.allclose(traced(x)["last_hidden_state"], want, rtol=0, atol=1e-6)
    copied = copy.deepcopy(patched)  # the patch reads the copy's own table
    with torch.no_grad():
        next(p for n, p in copied.named_parameters() if "position" in n).add_(1.0)
        assert not torch.equal(copied(pixel_values=x).last_hidden_state, want)


class Norm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bn = nn.BatchNorm2d(3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(x).square().mean()


def test_batchnorm_statistics_after_ort_steps(monkeypatch) -> None:
    """ORTModule's export forward leaves no update behind (wrapper._install_batchnorm_restore):
    the running mean is PyTorch's. ORT's own kernel updates the running variance with the
    biased batch variance (PyTorch: unbiased) and leaves num_batches_tracked at 0: both kept,
    as documented."""
    from ortft.backends.ortmodule import wrapper

    monkeypatch.setenv("ORTMODULE_FALLBACK_POLICY", "FALLBACK_DISABLE")
    from onnxruntime.training.ortmodule import ORTModule

    wrapper._install_export_counter()
    wrapper._install_batchnorm_restore()
    torch.manual_seed(0)
    xs = [torch.randn(2, 3, 2, 2) * 3 + 1 for _ in range(3)]  # 8 values a channel
    eager = Norm()
    module = copy.deepcopy(eager)
    ort = ORTModule(module)
    for x in xs:
        ort(x).backward()
        eager(x).backward()
    bn, ref = module.bn, eager.bn
    assert torch.allclose(bn.running_mean, ref.running_mean, rtol=0, atol=1e-6)
    var = torch.ones(3)
    for x in xs:  # momentum 0.1, the biased variance
        var = 0.9 * var + 0.1 * x.var((0, 2, 3), unbiased=False)
    assert torch.allclose(bn.running_var, var, rtol=0, atol=1e-5)
    assert float((bn.running_var - ref.running_var).abs().max()) > 0.1  # torch: unbiased
    assert int(bn.num_batches_tracked) == 0 and int(ref.num_batches_tracked) == 3
