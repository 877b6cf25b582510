"""``backend.unpad``: the encoder's per-position layers on the real tokens only (unpad.py).

The padded forward is the reference: on tiny models of every listed type, a training step's
loss and every gradient must equal it. The patched path must have run (``calls``), eval must
run the model as it is, and the parameters' names must not change. Then the recipe rules, and
one CLI run of each setting on varied lengths.
"""

from __future__ import annotations

import copy
import csv
import random
from pathlib import Path

import pytest
import torch
from conftest import WORDS, tiny_causal_lm, tiny_classifier, write_recipe
from helpers import losses, run_cli, summary
from test_preference import write_pairs

from ortft.backends.torch import unpad
from ortft.core.errors import InputError

SIZES = dict(
    vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
    intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
)  # fmt: skip
DISTILBERT = dict(vocab_size=120, dim=32, n_layers=2, n_heads=2, hidden_dim=64, dropout=0.0,
                  attention_dropout=0.0, max_position_embeddings=64)  # fmt: skip
DECODER = dict(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
               intermediate_size=64, max_position_embeddings=64, num_key_value_heads=1)  # fmt: skip
GPT2 = dict(vocab_size=120, n_embd=32, n_layer=2, n_head=2, n_inner=64, n_positions=64,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)  # fmt: skip


class FakeTask:
    def __init__(self, name: str, pads_unread: bool = True) -> None:
        self.name, self.pads_unread = name, pads_unread


def tiny(kind: str, auto: str = "AutoModelForSequenceClassification") -> torch.nn.Module:
    import transformers

    sizes = {"distilbert": DISTILBERT, "gpt2": GPT2}.get(kind) or dict(SIZES)
    if kind in unpad.DECODERS - {"gpt2"}:
        sizes = DECODER
    if kind == "albert":
        sizes["embedding_size"] = 16
    config = transformers.AutoConfig.for_model(kind, **sizes, pad_token_id=0, num_labels=3)
    torch.manual_seed(0)
    return getattr(transformers, auto).from_config(config, attn_implementation="eager")


def batch(rows: int = 4, length: int = 12, seed: int = 0) -> dict[str, torch.Tensor]:
    """Rows of 3..length real tokens, right-padded with 0s: most positions are padding."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 120, (rows, length), generator=g)
    mask = torch.zeros(rows, length, dtype=torch.long)
    for i, n in enumerate([3, length, 5, 7][:rows]):
        mask[i, :n] = 1
    return {"input_ids": ids * mask, "attention_mask": mask}


def step(
    model: torch.nn.Module, inputs: dict, labels: torch.Tensor, bf16: bool = False
) -> tuple[float, dict]:
    model.train()
    model.zero_grad()
    torch.manual_seed(0)  # a head's own dropout (albert's classifier) draws the same mask
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        out = model(**inputs, labels=labels)
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return float(out.loss), grads


def assert_same_step(
    model: torch.nn.Module, inputs: dict, labels: torch.Tensor, bf16: bool = False
) -> unpad.Unpadder:
    """A training step of ``model`` unpadded equals the padded one: loss and gradients (bf16:
    to bf16's rounding, a relative 1e-2, 8 bits of mantissa)."""
    padded = copy.deepcopy(model)
    loss, grads = step(padded, inputs, labels, bf16)
    state = unpad.install(unpad.encoder_of(model))
    loss_u, grads_u = step(model, inputs, labels, bf16)
    assert state.calls > 0, "the unpadded path never ran"
    rtol, atol = (1e-2, 1e-3) if bf16 else (1e-4, 1e-6)
    assert loss_u == pytest.approx(loss, rel=rtol / 10, abs=atol)
    assert grads_u.keys() == grads.keys()
    for name, g in grads.items():
        torch.testing.assert_close(grads_u[name], g, rtol=rtol, atol=atol, msg=name)
    return state


@pytest.mark.parametrize("kind", sorted(unpad.ENCODERS))
def test_an_unpadded_classification_step_equals_the_padded_one(kind: str) -> None:
    model = tiny(kind)
    state = assert_same_step(model, batch(), torch.tensor([0, 1, 2, 1]))
    assert state.patched, "nothing was patched"


@pytest.mark.parametrize("kind", sorted(unpad.DECODERS))
def test_an_unpadded_next_token_step_equals_the_padded_one(kind: str) -> None:
    """A decoder's causal-LM step (the loss of causal-lm, instruction and, per token, the
    preference log-probs), right-padded, labels -100 at padding; its MLP goes as one block."""
    inputs = batch()
    labels = torch.where(inputs["attention_mask"] == 1, inputs["input_ids"], -100)
    model = tiny(kind, "AutoModelForCausalLM")
    state = assert_same_step(model, inputs, labels)
    assert any(name.endswith(".mlp") for name in state.patched), state.patched
    if kind == "gpt2":  # the module swap the torch route makes first (fusions.py)
        from ortft.backends.torch import fusions

        model = tiny(kind, "AutoModelForCausalLM")
        assert fusions.fuse_tanh_gelu(model) == 2
        state = assert_same_step(model, inputs, labels, bf16=True)
        assert "h.0.mlp" in state.patched and "h.0.attn.c_attn" in state.patched


def test_a_bf16_step_on_the_cpu_equals_the_padded_one() -> None:
    """bf16 autocast with eager attention: the torch backend's bf16 route on a CPU."""
    assert_same_step(tiny("bert"), batch(), torch.tensor([0, 1, 2, 1]), bf16=True)


def test_token_classification_and_masked_lm_steps_equal_the_padded_ones() -> None:
    inputs = batch()
    labels = torch.where(inputs["attention_mask"] == 1, inputs["input_ids"] % 3, -100)
    assert_same_step(tiny("bert", "AutoModelForTokenClassification"), inputs, labels)
    labels = torch.full_like(inputs["input_ids"], -100)
    labels[:, 1] = inputs["input_ids"][:, 1]  # one masked position per row, all real
    assert_same_step(tiny("roberta", "AutoModelForMaskedLM"), inputs, labels)


def test_gradient_checkpointing_and_lora_unpad_to_the_same_step() -> None:
    model = tiny("bert")
    model.gradient_checkpointing_enable()
    assert_same_step(model, batch(), torch.tensor([0, 1, 2, 1]))
    import peft

    lora = peft.get_peft_model(
        tiny("bert"),
        peft.LoraConfig(r=4, target_modules=["query", "value"], init_lora_weights=False),
    )
    state = assert_same_step(lora, batch(), torch.tensor([0, 1, 2, 1]))
    assert any("lora_A" in name for name in state.patched)


def test_the_scatter_puts_zeros_where_it_skipped_whatever_memory_it_is_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The scatter writes into uninitialised memory: the skipped positions must come out as
    zeros (attention would turn a NaN there into NaN scores), the others as the gathered rows,
    and the gradient must reach the gathered rows only."""
    state = unpad.Unpadder()
    mask = batch(rows=4, length=40)["attention_mask"]  # 55 real of 160; 9 padded ride along
    encoder = torch.nn.Linear(1, 1)  # any module in training mode: the hook reads the mask
    state.arm(encoder, (), {"attention_mask": mask})
    assert state.idx is not None and state.skipped is not None
    assert len(state.idx) == unpad.ROUND and len(state.skipped) == mask.numel() - unpad.ROUND
    real = mask.reshape(-1).nonzero().squeeze(1)
    poisoned = torch.Tensor.new_empty
    monkeypatch.setattr(
        torch.Tensor, "new_empty", lambda t, *a, **k: poisoned(t, *a, **k).fill_(float("nan"))
    )
    rows = torch.randn(len(state.idx), 3, requires_grad=True)
    full = state.scatter(rows, state.idx)
    assert full.shape == (4, 40, 3)
    flat = full.reshape(-1, 3)
    assert torch.equal(flat[state.idx], rows.detach())
    assert torch.equal(flat[state.skipped], torch.zeros(len(state.skipped), 3))
    assert torch.equal(flat[real], rows.detach()[: len(real)])
    (full * 2).sum().backward()
    assert torch.equal(rows.grad, torch.full_like(rows, 2.0))


def test_eval_and_unpadded_batches_run_the_model_as_it_is() -> None:
    model = tiny("bert")
    names = [n for n, _ in model.named_parameters()]
    state = unpad.install(unpad.encoder_of(model))
    assert [n for n, _ in model.named_parameters()] == names  # checkpoints see the same model
    model.eval()
    with torch.no_grad():
        model(**batch())
    full = {"input_ids": torch.randint(5, 120, (2, 6)), "attention_mask": torch.ones(2, 6)}
    model.train()
    model(**full)  # no padding: nothing to gather
    assert state.calls == 0
    twin = copy.deepcopy(model)  # a copy's patched forwards are its own (its own weights)
    twin.bert.encoder.layer[0].intermediate.dense.weight.data.zero_()
    twin.train()
    twin_logits = twin(**batch()).logits.detach()
    copied = twin.bert.encoder.layer[0]._ortft_unpadder  # its feed-forward chunk is patched
    assert copied is not state and copied.calls > 0 and state.calls == 0
    assert not torch.allclose(model(**batch()).logits, twin_logits)


def test_the_plan_says_where_unpad_applies_and_refuses_true_elsewhere() -> None:
    bert, task = tiny("bert"), FakeTask("sequence-classification")
    assert unpad.plan(bert, task, "auto", compiled=False)[0] is True
    assert unpad.plan(bert, task, False, compiled=False) == (False, "backend.unpad=false")
    assert unpad.plan(bert, task, "auto", False, "cuda") == (False, unpad.CUDA_AUTO)
    assert unpad.plan(bert, task, True, False, "cuda")[0] is True  # asked for: on a GPU too
    on, why = unpad.plan(bert, task, "auto", compiled=True)
    assert not on and "compiled" in why
    on, why = unpad.plan(bert, FakeTask("question-answering", False), "auto", compiled=False)
    assert not on and "question-answering reads padded positions" in why
    with pytest.raises(InputError, match="backend.unpad=true cannot apply: model type deberta-v2"):
        unpad.plan(tiny("deberta-v2"), task, True, compiled=False)


def test_recipe_rules_refuse_unpad_true_where_it_cannot_apply() -> None:
    from types import SimpleNamespace as NS

    from pydantic import ValidationError

    from ortft.recipe.backends import unpad_problems
    from ortft.recipe.schema import Recipe

    def problems(task: str = "sequence-classification", **backend) -> list[str]:
        b = {"name": "torch", "compile": False, "unpad": True, **backend}
        return unpad_problems(NS(backend=NS(**b), task=NS(name=task)))

    assert problems() == [] and problems(unpad="auto", compile=True) == []
    assert problems(name="ort") == []  # traced into ORTModule's graph (test_ort_unpad.py)
    assert problems(name="ort-ondevice") == [
        "backend.unpad=true: it is the torch and ort backends' (set backend.name=torch or ort)"
    ]
    assert "recompile" in problems(compile="auto")[0]
    assert problems("question-answering") == [
        "backend.unpad=true: task question-answering reads padded positions"
    ]
    r = tiny_classifier("t.csv", backend="auto")
    r["backend"]["unpad"] = True
    with pytest.raises(ValidationError, match="backend.unpad=true: it is the torch and ort"):
        Recipe.model_validate(r)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("unpad")
    rng = random.Random(0)
    with open(root / "train.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["text", "label"])
        for _ in range(80):
            words = [rng.choice(WORDS) for _ in range(rng.choice([1, 2, 3, 12]))]
            w.writerow([" ".join(words), rng.choice(["pos", "neg"])])
    r = tiny_classifier("train.csv", backend="torch", max_steps=6, batch_size=8)
    r["data"].update(eval_fraction=0.0)
    r["export"] = {"enabled": False}
    write_recipe(root / "r.yaml", r)
    return root


def test_a_run_unpads_by_default_with_the_losses_of_an_unpadded_run(work: Path) -> None:
    runs = {}
    for setting in ("auto", "false"):
        res = run_cli("train", work / "r.yaml", f"backend.unpad={setting}",
                      "--output-dir", work / setting, env={"NO_COLOR": "1"})  # fmt: skip
        assert res.returncode == 0, res.stderr[-2000:]
        runs[setting] = work / setting
    on, off = summary(runs["auto"])["backend"]["unpad"], summary(runs["false"])["backend"]["unpad"]
    assert on["on"] is True and on["gathered_forwards"] > 0, on
    assert off == {"on": False, "why": "backend.unpad=false", "gathered_forwards": 0}
    assert losses(runs["auto"]) == pytest.approx(losses(runs["false"]), rel=1e-4)


def test_a_dpo_run_unpads_its_decoder_with_the_losses_of_a_padded_run(tmp_path: Path) -> None:
    """The torch route's DPO (GPT-2, pairs of varied lengths, chosen and rejected in one
    batch): unpadded by default, the losses of ``backend.unpad=false``."""
    write_pairs(tmp_path / "pairs.jsonl", 24)
    r = tiny_causal_lm("pairs.jsonl", backend="torch", max_steps=4, batch_size=4)
    r["task"] = {"name": "preference", "loss": "dpo", "beta": 0.5}
    r["data"].update(eval_fraction=0.0)
    r["export"] = {"enabled": False}
    recipe = write_recipe(tmp_path / "dpo.yaml", r)
    runs = {}
    for setting in ("auto", "false"):
        runs[setting] = tmp_path / setting
        res = run_cli("train", recipe, f"backend.unpad={setting}", "--output-dir", runs[setting],
                      env={"NO_COLOR": "1"})  # fmt: skip
        assert res.returncode == 0, res.stderr[-2000:]
    on = summary(runs["auto"])["backend"]["unpad"]
    assert on["on"] is True and on["gathered_forwards"] > 0, on
    assert summary(runs["false"])["backend"]["unpad"]["on"] is False
    assert losses(runs["auto"]) == pytest.approx(losses(runs["false"]), rel=1e-4)
