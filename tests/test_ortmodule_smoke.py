"""ORTModule really trains on this machine: a 2-layer MLP, 3 SGD steps on CPU, gradients equal
to eager PyTorch's. This fails when ORTModule's C++ extensions are missing or do not load."""

from __future__ import annotations

import copy

import pytest
import torch

pytestmark = pytest.mark.ort  # ORTModule itself

TOL = 1e-5


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def _max_diff(a, b) -> float:
    return (a.detach() - b.detach()).abs().max().item()


def test_ortmodule_matches_eager_gradients_on_cpu(monkeypatch):
    # Fail loudly instead of silently running PyTorch when ORTModule cannot run the model.
    # ORTModule reads this when it is constructed; monkeypatch keeps it out of other tests.
    monkeypatch.setenv("ORTMODULE_FALLBACK_POLICY", "FALLBACK_DISABLE")
    from onnxruntime.training import ortmodule
    from onnxruntime.training.ortmodule import ORTModule

    assert ortmodule._FALLBACK_INIT_EXCEPTION is None, ortmodule._FALLBACK_INIT_EXCEPTION

    torch.manual_seed(0)
    eager = MLP()
    ort = ORTModule(copy.deepcopy(eager))
    opt_eager = torch.optim.SGD(eager.parameters(), lr=0.1)
    opt_ort = torch.optim.SGD(ort.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(1)
    batches = [
        (torch.randn(4, 8, generator=generator), torch.randint(0, 3, (4,), generator=generator))
        for _ in range(3)
    ]

    for step, (x, y) in enumerate(batches):
        losses = []
        for model, opt in ((eager, opt_eager), (ort, opt_ort)):
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            losses.append(loss)
        assert _max_diff(*losses) <= TOL, f"step {step}: loss {losses[0]} vs {losses[1]}"
        pairs = list(zip(eager.named_parameters(), ort.named_parameters(), strict=True))
        assert len(pairs) == 4
        for (name, p_eager), (ort_name, p_ort) in pairs:
            assert ort_name.endswith(name), (name, ort_name)
            assert p_ort.grad is not None, f"step {step}: no gradient for {name} under ORT"
            diff = _max_diff(p_eager.grad, p_ort.grad)
            assert diff <= TOL, f"step {step}: grad of {name} differs by {diff:.2e}"
        opt_eager.step()
        opt_ort.step()

    for (name, p_eager), (_, p_ort) in zip(
        eager.named_parameters(), ort.named_parameters(), strict=True
    ):
        assert _max_diff(p_eager, p_ort) <= TOL, f"weights of {name} diverged"

    # Proof that ONNX Runtime ran the model, not a silent PyTorch fallback.
    module = ort._torch_module
    assert type(module).__name__ == "TorchModuleORT"
    manager = module._execution_manager(True)
    assert manager._onnx_models.optimized_model is not None, "no ONNX training graph was built"
    assert manager._execution_agent is not None, "no ORT execution agent was created"
    assert not manager._fallback_manager.is_pending()
