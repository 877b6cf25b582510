"""``backend.dropout_masks``: dropout's keep-masks from 16-bit draws (backends/torch/dropout.py).

The masks keep at the rounded rate and scale to the input's expectation, the gradient is the
mask's, every dropout of a training forward goes through them (modules and the attention's
functional call) and none outside training; the plan and the recipe rules say where they
apply; a CLI run draws them and resumes bit for bit.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import tiny_classifier, write_recipe
from helpers import losses, run_cli, summary
from test_unpad import SIZES, batch

from ortft.backends.torch import dropout
from ortft.backends.torch.eager import EAGER_WITH_OWN_MASKS


def test_masks_keep_at_the_rounded_rate_and_scale_to_the_input_mean() -> None:
    n, p = 1 << 20, 0.1
    keep_rate = dropout.kept_levels(p) / dropout.LEVELS
    assert abs(keep_rate - (1 - p)) < 7.7e-6
    torch.manual_seed(0)
    x = torch.ones(n, requires_grad=True)
    out = dropout.dropout(x, p)
    kept = out != 0
    assert out.unique().tolist() == [0.0, pytest.approx(1 / keep_rate, rel=1e-6)]
    sigma = math.sqrt(keep_rate * (1 - keep_rate) / n)
    assert abs(kept.float().mean().item() - keep_rate) < 5 * sigma
    assert abs(out.mean().item() - 1.0) < 6 * sigma / keep_rate  # the input's expectation
    out.backward(torch.full((n,), 2.0))
    assert torch.equal(x.grad, kept.float() * 2 / keep_rate)  # the forward's mask, scaled
    # another p keeps at its own rate: the threshold follows p
    half = dropout.dropout(torch.ones(n), 0.5)
    assert abs((half != 0).float().mean().item() - 0.5) < 5 * math.sqrt(0.25 / n)


def test_masks_come_from_torchs_generator_in_every_layout() -> None:
    x = torch.randn(3, 5, 7)
    torch.manual_seed(1)
    a = dropout.dropout(x, 0.3)
    torch.manual_seed(1)
    assert torch.equal(a, dropout.dropout(x, 0.3))  # seeded: resumable from the RNG state
    assert not torch.equal(a, dropout.dropout(x, 0.3))  # and the generator moves on
    t = x.transpose(0, 2)  # not contiguous, an odd element count (105)
    out, scale = dropout.dropout(t, 0.3), dropout.LEVELS / dropout.kept_levels(0.3)
    assert out.shape == t.shape and 0 < int((out == 0).sum()) < t.numel()
    assert torch.equal(out, torch.where(out == 0, 0.0, t * scale))
    b = dropout.dropout(x.bfloat16().requires_grad_(), 0.3)
    assert b.dtype == torch.bfloat16
    # the backward keeps one tensor, the mask in the input's dtype: torch's CPU dropout keeps
    # its noise so, hence the same memory
    (keep,) = b.grad_fn.saved_tensors
    assert keep.dtype == torch.bfloat16 and keep.shape == x.shape
    assert torch.equal(keep, (b != 0).bfloat16())


def test_bf16_inputs_are_scaled_by_the_exact_inverse_not_a_rounded_one() -> None:
    # 1/0.9 in bf16 is 1.109: a mask holding the scale would shrink every kept value by 0.16%
    torch.manual_seed(2)
    x = (torch.rand(1 << 20) + 0.5).bfloat16().requires_grad_()
    out = dropout.dropout(x, 0.1)
    kept = out != 0
    scale = dropout.LEVELS / dropout.kept_levels(0.1)
    ratio = (out.float()[kept] / x.detach().float()[kept]).mean().item()
    assert ratio == pytest.approx(scale, rel=1e-4)
    out.backward(torch.ones_like(out))
    assert x.grad is not None
    assert torch.equal(x.grad, torch.where(kept, torch.tensor(scale).bfloat16(), 0.0))


def tiny_bert(rate: float) -> torch.nn.Module:
    import transformers

    sizes = {**SIZES, "hidden_dropout_prob": rate, "attention_probs_dropout_prob": rate}
    config = transformers.BertConfig(**sizes, pad_token_id=0, num_labels=3)
    torch.manual_seed(0)
    return transformers.BertForSequenceClassification._from_config(
        config, attn_implementation="eager"
    )


class Spy(torch.overrides.TorchFunctionMode):
    """Counts F.dropout calls that would drop (training, p > 0), passing every call through."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if func is torch.nn.functional.dropout:
            bound = dropout._DROPOUT_ARGS.bind(*args, **kwargs)
            bound.apply_defaults()
            self.calls += bool(bound.arguments["training"]) and bound.arguments["p"] > 0
        return func(*args, **kwargs)


def test_every_dropout_of_a_training_forward_takes_the_masks_and_none_in_eval() -> None:
    model, inputs = tiny_bert(0.1), batch(rows=4, length=12)
    spy = Spy()
    with spy:
        model(**inputs)
    masks = dropout.Masks()
    with masks:
        model(**inputs)
    # embeddings, per layer the attention's probabilities (functional), its output and the
    # feed-forward's output, then the classifier
    assert masks.calls == spy.calls == 1 + 3 * SIZES["num_hidden_layers"] + 1
    model.eval()
    with masks:
        out = model(**inputs).logits
    assert masks.calls == spy.calls and torch.equal(out, model(**inputs).logits)


def test_a_training_step_has_the_gradient_of_its_masks() -> None:
    """The same model, once with torch's dropout and once with the 16-bit masks: the losses
    differ (other masks) but both train, and the masked run's gradients match a recomputation
    with its masks replayed from the same generator state."""
    model, inputs = tiny_bert(0.2), batch(rows=4, length=12)
    labels = torch.tensor([0, 1, 2, 1])
    state = torch.get_rng_state()
    with dropout.Masks():
        loss = model(**inputs, labels=labels).loss
    loss.backward()
    first = {n: q.grad.clone() for n, q in model.named_parameters()}
    model.zero_grad()
    torch.set_rng_state(state)
    with dropout.Masks():
        again = model(**inputs, labels=labels).loss
    again.backward()
    assert again.item() == loss.item()
    for n, q in model.named_parameters():
        assert torch.equal(q.grad, first[n]), n
    torch.set_rng_state(state)
    assert model(**inputs, labels=labels).loss.item() != loss.item()  # torch's own masks


def test_probabilities_at_the_edges_stay_torchs() -> None:
    x = torch.ones(64)
    with dropout.Masks() as masks:
        assert torch.equal(torch.nn.functional.dropout(x, 1.0), torch.zeros(64))
        assert torch.equal(torch.nn.functional.dropout(x, 0.0), x)
        torch.nn.functional.dropout(x, 1e-6)  # rounds to keeping every element: torch's
        torch.nn.functional.dropout(x, 0.5, training=False)
        y = torch.ones(64)
        torch.nn.functional.dropout(y, 0.5, inplace=True)  # in place: torch's, as asked
        assert 0 < int((y == 0).sum()) < 64
        with pytest.raises(RuntimeError):  # not floating point: torch's own error
            torch.nn.functional.dropout(torch.arange(4), 0.5)
    assert masks.calls == 0


def test_the_plan_says_where_the_masks_apply(monkeypatch: pytest.MonkeyPatch) -> None:
    model = tiny_bert(0.1)
    monkeypatch.setattr(dropout, "torch_version", lambda: (2, 13))
    assert dropout.plan("auto", False, "cpu", model)[0] is True
    assert dropout.plan("int16", False, "cpu", model)[0] is True
    assert dropout.plan("auto", False, "cuda", model)[0] is False
    assert dropout.plan("int16", False, "cuda", model) == (False, "torch's dropout (not a CPU)")
    assert dropout.plan("torch", False, "cpu", model)[0] is False
    assert dropout.plan("auto", True, "cpu", model) == (
        False, "torch's dropout (a compiled forward: inductor draws the masks)"
    )  # fmt: skip
    assert dropout.plan("auto", False, "cpu", tiny_bert(0.0)) == (False, "no dropout in the model")
    monkeypatch.setattr(dropout, "torch_version", lambda: (2, 6))
    assert dropout.plan("auto", False, "cpu", model)[0] is False
    model.gradient_checkpointing_enable()
    assert "gradient checkpointing" in dropout.plan("int16", False, "cpu", model)[1]


def test_fp32_attention_turns_eager_where_the_masks_draw() -> None:
    """sdpa draws its attention dropout inside the kernel, where the masks cannot reach it."""
    from ortft.backends.torch import eager, models

    cpu = torch.device("cpu")
    for setting, rate, attention in [("int16", 0.1, "eager"), ("torch", 0.1, "sdpa"),
                                     ("int16", 0.0, "sdpa")]:  # fmt: skip
        backend = eager.TorchBackend(dropout_masks=setting)
        assert backend.attn_implementation(cpu, "fp32") == "sdpa"
        model = tiny_bert(rate)
        model.set_attn_implementation("sdpa")
        task = SimpleNamespace(forward=None)  # wrap reads none of it: unpad is off
        module = backend.wrap(models.TaskModule(model, task), Path("unused"))
        assert model.config._attn_implementation == "sdpa"  # planned, not applied (DeepSpeed)
        backend.outer(module)  # the training forward: the masks applied
        assert model.config._attn_implementation == attention, (setting, rate)
        assert backend.attention == attention
        note = backend.report().notes
        assert (eager.EAGER_WITH_OWN_MASKS in note) is (attention == "eager"), note


def test_recipe_rules_refuse_int16_where_the_eager_forward_is_not_torchs() -> None:
    from pydantic import ValidationError

    from ortft.recipe.schema import Recipe

    for backend, extra, why in [
        ("ort", {}, "it is the torch backend's"),
        ("torch", {"compile": True}, "a compiled forward draws its own masks"),
    ]:
        r = tiny_classifier("t.csv", backend=backend)
        r["backend"].update(dropout_masks="int16", **extra)
        with pytest.raises(ValidationError, match=f"backend.dropout_masks=int16: {why}"):
            Recipe.model_validate(r)
    r = tiny_classifier("t.csv", backend="torch")
    r["backend"]["dropout_masks"] = "int16"
    r["hardware"] = {"gradient_checkpointing": True}
    with pytest.raises(ValidationError, match="gradient checkpointing recomputes"):
        Recipe.model_validate(r)
    r = tiny_classifier("t.csv", backend="auto")
    r["backend"]["dropout_masks"] = "int16"
    assert Recipe.model_validate(r).backend.dropout_masks == "int16"


def test_a_run_draws_its_masks_and_resumes_bit_for_bit(tmp_path: Path) -> None:
    from test_batching import _varied_csv

    _varied_csv(tmp_path / "train.csv")
    r = tiny_classifier("train.csv", backend="torch", max_steps=6, batch_size=8)
    r["model"]["dropout"] = 0.1
    r["data"].update(max_length=32, eval_fraction=0.0)
    r["checkpoint"] = {"save_every": 3}
    r["export"] = {"enabled": False}
    recipe, run = write_recipe(tmp_path / "r.yaml", r), tmp_path / "run"
    own = ["backend.dropout_masks=int16", "--output-dir", run]
    res = run_cli("train", recipe, *own, env={"NO_COLOR": "1"})
    assert res.returncode == 0, res.stderr[-2000:]
    record = summary(run)["backend"]["dropout_masks"]
    assert record["own"] is True and record["calls"] >= 6, record
    assert EAGER_WITH_OWN_MASKS in summary(run)["backend"]["notes"]  # fp32: sdpa turned eager
    full = losses(run)
    for name in ("final", "step-000006", "summary.json"):  # as if killed after step 3
        target = run / name
        shutil.rmtree(target) if target.is_dir() else target.unlink()
    res = run_cli("train", recipe, *own, env={"NO_COLOR": "1"})
    assert res.returncode == 0, res.stderr[-2000:]
    assert summary(run)["resumed_from"].endswith("step-000003")
    assert losses(run) == full  # the same masks after the resume
    res = run_cli("train", recipe, "backend.dropout_masks=torch", "--output-dir",
                  tmp_path / "torch", env={"NO_COLOR": "1"})  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    assert summary(tmp_path / "torch")["backend"]["dropout_masks"]["own"] is False
    assert EAGER_WITH_OWN_MASKS not in summary(tmp_path / "torch")["backend"]["notes"]
    assert losses(tmp_path / "torch") != full  # torch's masks are others
