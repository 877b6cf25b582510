"""DoRA (adapter.kind: dora): peft's use_dora on the same targets as LoRA, merged for export like
LoRA, refused on ORTModule (which cannot build its backward) and on a peft without it."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_recipe import MINIMAL, load_error, write

from ortft.recipe import io as recipe_io

torch = pytest.importorskip("torch")
pytest.importorskip("peft")


def _train(kind: str, steps: int) -> tuple[object, torch.Tensor]:
    """A tiny GPT-2 from a seeded config with a rank-4 adapter, after ``steps`` AdamW steps on
    one fixed batch (no dropout, so both kinds see the same computation)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from ortft.backends.torch import models
    from ortft.recipe.model import AdapterSection

    torch.manual_seed(0)
    config = GPT2Config(
        n_embd=32, n_layer=2, n_head=2, vocab_size=100, n_positions=16,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    model = models.apply_adapter(GPT2LMHeadModel(config), AdapterSection(kind=kind, rank=4))
    trained = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trained, lr=1e-2)
    x = torch.randint(0, 100, (2, 8), generator=torch.Generator().manual_seed(1))
    for _ in range(steps):
        model(input_ids=x, labels=x).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return model.eval(), x


def _trainable(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def test_dora_trains_magnitudes_differs_from_lora_and_merges_exactly() -> None:
    from ortft.backends.torch import models

    lora, x = _train("lora", 1)
    dora, _ = _train("dora", 1)
    lw, dw = _trainable(lora), _trainable(dora)
    magnitudes = sorted(set(dw) - set(lw))
    assert len(magnitudes) == 2 and all("lora_magnitude_vector" in n for n in magnitudes)
    assert not any("magnitude" in n for n in lw)
    # a magnitude starts as its weight's column norms; one step moves it, and with it the output
    base = {n: p for n, p in dora.named_parameters() if "c_attn.base_layer.weight" in n}
    for name in magnitudes:
        weight = base[name.replace("lora_magnitude_vector.default.weight", "base_layer.weight")]
        assert (dw[name] - weight.detach().norm(dim=0)).abs().max() > 1e-4
    with torch.no_grad():
        out_lora, out_dora = lora(input_ids=x).logits, dora(input_ids=x).logits
        assert (out_lora - out_dora).abs().max() > 1e-4
        # export folds the adapter into the base weights: the merged model computes the same
        merged = models.merged_copy(dora)
        assert not hasattr(merged, "peft_config")
        assert (merged(input_ids=x).logits - out_dora).abs().max() < 1e-5
    # the first step's A/B updates match LoRA's (m = ||W|| at the start, the norm is detached);
    # from the second on, the moved magnitudes change the A/B gradients too
    lora2, dora2 = _trainable(_train("lora", 2)[0]), _trainable(_train("dora", 2)[0])
    for name in lw:
        assert torch.equal(lw[name], dw[name]), name
        assert (lora2[name] - dora2[name]).abs().max() > 1e-4, name


def test_dora_on_ort_is_a_recipe_error_naming_torch(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL)
    err = load_error(path, ["adapter.kind=dora", "backend.name=ort"], check_files=False)
    assert "adapter.kind=dora needs backend.name=torch" in str(err)
    assert "ORTModule" in str(err)
    r = recipe_io.load(path, ["adapter.kind=dora", "backend.name=torch"]).recipe
    assert r.adapter is not None and r.adapter.kind == "dora"


def test_dora_needs_a_peft_with_use_dora(tmp_path: Path, monkeypatch) -> None:
    from ortft.recipe import model

    monkeypatch.setattr(model, "installed_peft", lambda: "0.8.2")
    path = write(tmp_path, MINIMAL)
    err = load_error(path, ["adapter.kind=dora", "backend.name=torch"], check_files=False)
    assert "adapter.kind" in str(err) and "dora needs peft >= 0.9" in str(err)
    assert "0.8.2" in str(err)
    assert recipe_io.load(path, ["adapter.kind=lora", "backend.name=torch"]).recipe.adapter
