"""The ORT backend's fallback policy: strict by default, loud and recorded when allowed.

GPT-2 with ``use_cache`` on returns a ``DynamicCache``, which ORTModule cannot flatten; by
default ORTModule would quietly run PyTorch instead. ortft must either stop or say so.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from ortft.backends.torch.wrappers import wrapper as get
from ortft.core.errors import BackendError
from ortft.recipe.schema import BackendSection


class _ReturnsCache(torch.nn.Module):
    """A decoder forward that leaves use_cache on: what TaskModule exists to prevent."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        cfg = GPT2Config(
            vocab_size=50,
            n_embd=16,
            n_layer=1,
            n_head=2,
            n_positions=16,
            bos_token_id=0,
            eos_token_id=0,
        )
        cfg._attn_implementation = "eager"
        self.model = GPT2LMHeadModel(cfg)

    def forward(self, input_ids: torch.Tensor):
        return self.model(input_ids=input_ids, labels=input_ids, use_cache=True)


def _step(backend, wrapped) -> None:
    out = wrapped(torch.randint(0, 50, (2, 8)))
    loss = out[0] if isinstance(out, tuple) else out.loss
    loss.backward()
    backend.after_step(wrapped)


@pytest.mark.ort
def test_strict_policy_stops_instead_of_falling_back(tmp_path: Path) -> None:
    """ortft sets ORTMODULE_FALLBACK_POLICY=FALLBACK_DISABLE, so ORTModule itself raises on the
    first forward: it cannot flatten the DynamicCache output (ORT 1.19.2). No PyTorch step ran."""
    from onnxruntime.training.ortmodule._fallback_exceptions import ORTModuleIOError

    backend = get("ort", BackendSection(name="ort"))
    wrapped = backend.wrap(_ReturnsCache(), tmp_path)
    with pytest.raises(ORTModuleIOError, match=r"Unsupported flatten data type: .*DynamicCache"):
        _step(backend, wrapped)
    assert backend.report().fallback is False


@pytest.mark.ort
def test_strict_policy_stops_a_fallback_ortmodule_took_anyway(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second line of defence: had ORTModule fallen back regardless (its policy left at its
    default), ortft's after_step sees it and stops with the reason and the fix."""
    backend = get("ort", BackendSection(name="ort"))
    configure = backend._configure_env

    def leave_fallback_on(run_dir: Path) -> None:
        configure(run_dir)
        monkeypatch.delenv(
            "ORTMODULE_FALLBACK_POLICY", raising=False
        )  # ORTModule's default: fall back

    monkeypatch.setattr(backend, "_configure_env", leave_fallback_on)
    wrapped = backend.wrap(_ReturnsCache(), tmp_path)
    with pytest.raises(
        BackendError,
        match=r"ONNX Runtime could not run this model \(ORTModuleIOError: .*DynamicCache.*\); "
        r"set backend.name=torch, or backend.allow_fallback=true",
    ):
        _step(backend, wrapped)


@pytest.mark.ort
def test_allowed_fallback_is_recorded(tmp_path: Path) -> None:
    backend = get("ort", BackendSection(name="ort", allow_fallback=True))
    wrapped = backend.wrap(_ReturnsCache(), tmp_path)
    _step(backend, wrapped)
    report = backend.report()
    assert report.fallback is True
    assert report.used == "torch"
    assert report.fallback_reason


def test_fallback_error_message_names_the_fix(tmp_path: Path) -> None:
    backend = get("ort", BackendSection(name="ort"))
    with pytest.raises(BackendError, match="allow_fallback"):
        backend._fell_back("could not export")


def test_torch_backend_is_the_identity(tmp_path: Path) -> None:
    module = torch.nn.Linear(2, 2)
    backend = get("torch", BackendSection(name="torch"))
    assert backend.wrap(module, tmp_path) is module
    assert backend.report().used == "torch"
