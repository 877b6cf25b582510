"""``backend.unpad`` on the ort backend: the per-position layers on the real tokens, as ops of
ORTModule's exported graph (``unpad.arm_in_graph``).

ORTModule exports the forward once and runs that graph for every later batch, so the padded
ORTModule run is the reference over batches of different shapes and padding: the loss and every
gradient must equal it (test_unpad.py's fp32 tolerances), and the graph must hold the gather
(a NonZero of the mask): BERT and DistilBERT here, the other listed types in the archs tier.
Then one CLI run of each setting, and the ``auto`` / ``true`` plan.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import write_recipe
from helpers import losses, run_cli, summary
from test_unpad import batch, tiny
from test_unpad import work as work  # the varied-length CSV and recipe, shared

from ortft.backends.torch import unpad

pytestmark = pytest.mark.ort  # ORTModule itself

# batches of different sizes, lengths and padding, one with none: one exported graph runs them all
SHAPES = [(4, 12), (3, 9), (4, 16)]


class Step(torch.nn.Module):
    """(loss, logits) from keyword inputs, as ortft's TaskModule gives ORTModule."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, **inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.model(**inputs)
        return out.loss, out.logits


def ort(model: torch.nn.Module, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("ORTMODULE_FALLBACK_POLICY", "FALLBACK_DISABLE")
    from onnxruntime.training.ortmodule import ORTModule

    return ORTModule(Step(model))


def steps(wrapped: Any) -> list[tuple[float, dict[str, torch.Tensor]]]:
    out = []
    for seed, (rows, length) in enumerate(SHAPES):
        inputs = batch(rows, length, seed)
        if seed == 2:
            inputs["attention_mask"][:] = 1  # no padding at all
        wrapped.train()
        wrapped.zero_grad()
        loss, _ = wrapped(**inputs, labels=torch.tensor([0, 1, 2, 1][:rows]))
        loss.backward()
        grads = {n: p.grad.clone() for n, p in wrapped.named_parameters() if p.grad is not None}
        out.append((float(loss), grads))
    return out


def exported(wrapped: Any) -> Any:
    manager = wrapped._torch_module._execution_manager(True)
    return manager._graph_transition_manager._exported_model_info.exported_model


def graph_ops(wrapped: Any) -> set[str]:
    return {node.op_type for node in exported(wrapped).graph.node}


# the fast tier's two: BERT (a feed-forward chunk, ``*Output`` blocks) and DistilBERT (single
# Linear layers); the archs tier (make test-archs) checks the other listed types
FAST = ["bert", "distilbert"]


@pytest.mark.parametrize("kind", FAST)
def test_an_unpadded_ort_graph_trains_as_the_padded_one(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert_same_ort_steps(kind, monkeypatch)


@pytest.mark.archs
@pytest.mark.parametrize("kind", sorted(unpad.MODEL_TYPES - set(FAST)))
def test_every_listed_type_trains_unpadded_on_ort_as_padded(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert_same_ort_steps(kind, monkeypatch)


def test_row_gathers_routed_to_pytorch_train_as_the_padded_graph(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """backend.pytorch_kernels' index_select: the gathers as ATen nodes (PyTorch's index_add
    for their gradient, not ORT's GatherGrad), the same losses and gradients."""
    from ortft.backends.ortmodule import kernels

    try:
        unpadded = assert_same_ort_steps("bert", monkeypatch, routed=("index_select",))
        assert kernels.routed(exported(unpadded)).get("index_select", 0) >= 2
    finally:
        kernels.install((), torch.nn.Linear(1, 1))  # unrouted again for the tests after


def assert_same_ort_steps(
    kind: str, monkeypatch: pytest.MonkeyPatch, routed: tuple[str, ...] = ()
) -> Any:
    """Three steps of ``kind`` in ORTModule unpadded equal the padded ORTModule's (``routed``:
    the PyTorch kernels the unpadded graph runs); the unpadded ORTModule."""
    from ortft.backends.ortmodule import kernels

    model = tiny(kind)
    for module in model.modules():  # ORT's dropout draws from its own generator in each graph
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0  # DistilBERT's head has seq_classif_dropout 0.2
    padded = ort(copy.deepcopy(model), monkeypatch)
    state = unpad.install(unpad.encoder_of(model), in_graph=True)
    kernels.install(routed, model)
    unpadded = ort(model, monkeypatch)
    reference, got = steps(padded), steps(unpadded)
    assert state.calls > 0, "the unpadded path was never traced"
    assert "NonZero" in graph_ops(unpadded) and "NonZero" not in graph_ops(padded)
    for (loss, grads), (loss_u, grads_u) in zip(reference, got, strict=True):
        assert loss_u == pytest.approx(loss, rel=1e-5, abs=1e-6)
        assert grads_u.keys() == grads.keys()
        for name, g in grads.items():
            torch.testing.assert_close(grads_u[name], g, rtol=1e-4, atol=1e-6, msg=name)
    return unpadded


def test_an_ort_run_unpads_with_the_losses_of_a_padded_run(work: Path) -> None:
    runs = {}
    for setting in ("true", "false"):
        write_recipe(work / "ort.yaml", {**_recipe(work), "backend": {"name": "ort"}})
        res = run_cli("train", work / "ort.yaml", f"backend.unpad={setting}",
                      "--output-dir", work / f"ort-{setting}", env={"NO_COLOR": "1"})  # fmt: skip
        assert res.returncode == 0, res.stderr[-2000:]
        runs[setting] = work / f"ort-{setting}"
    on, off = summary(runs["true"])["backend"], summary(runs["false"])["backend"]
    assert on["used"] == "ort" and not on["fallback"], on
    assert on["unpad"]["on"] is True and on["unpad"]["traced_gathers"] > 0, on["unpad"]
    assert off["unpad"] == {"on": False, "why": "backend.unpad=false", "traced_gathers": 0}
    assert losses(runs["true"]) == pytest.approx(losses(runs["false"]), rel=1e-4)


def _recipe(work: Path) -> dict:
    import yaml

    return yaml.safe_load((work / "r.yaml").read_text())


def test_auto_leaves_the_ort_route_padded_and_true_refuses_where_it_cannot_apply() -> None:
    from types import SimpleNamespace as NS

    from test_unpad import FakeTask

    from ortft.backends.ortmodule.wrapper import UNPAD_AUTO, OrtBackend
    from ortft.core.errors import InputError

    model = tiny("bert")
    module = NS(model=model, task=FakeTask("sequence-classification"), parameters=model.parameters)
    backend = OrtBackend(NS(unpad="auto"))
    backend._unpad(module)
    assert backend.report().extra["unpad"] == {"on": False, "why": UNPAD_AUTO, "traced_gathers": 0}
    module.task = FakeTask("question-answering", pads_unread=False)
    with pytest.raises(InputError, match="question-answering reads padded positions"):
        OrtBackend(NS(unpad=True))._unpad(module)
