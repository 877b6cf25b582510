"""``task.share_prefix``: a pair as one row, the tokens its two sequences share run once
(sharing.py).

The two-row batch is the reference: on tiny models of every listed type, the log-probs the
losses read and every gradient must equal it. Then the layout of one pair by hand, where the
option applies, and runs on both routes with the losses of ``task.share_prefix=false``.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from conftest import tiny_causal_lm, write_recipe
from helpers import losses, run_cli, summary
from test_preference import write_pairs

from ortft.core.constants import IGNORE_INDEX
from ortft.core.errors import InputError
from ortft.families.preference import family, sharing
from ortft.families.preference import losses as pref_losses
from ortft.families.preference.task import Options

GPT2 = dict(vocab_size=120, n_embd=32, n_layer=2, n_head=2, n_inner=64, n_positions=64,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)  # fmt: skip
DECODER = dict(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
               intermediate_size=64, max_position_embeddings=64)  # fmt: skip
PROMPT = [5, 3, 8, 2, 9, 4, 6, 7, 11]


def tiny(kind: str, attn: str) -> torch.nn.Module:
    import transformers

    sizes = GPT2 if kind == "gpt2" else DECODER
    if kind not in ("gpt2", "gpt_neox"):  # grouped-query attention: one key/value head
        sizes = {**sizes, "num_key_value_heads": 1}
    config = transformers.AutoConfig.for_model(kind, **sizes, pad_token_id=0)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attn)


def pairs() -> dict[str, torch.Tensor]:
    """Four pairs, right-padded: prompts of 2 to 9 tokens, responses that share their first
    tokens or none, one rejected response a prefix of its chosen one's."""
    prompts = [4, 2, 9, 3]
    chosen = [[7, 8, 9], [10, 11, 12, 13, 14, 15, 16, 17], [20], [30, 31, 32, 33]]
    rejected = [[7, 8, 6, 1], [10, 11, 12, 13, 14, 15, 16, 99, 98], [21, 22], [30, 31]]
    out = {}
    for prefix, responses in (("", chosen), ("rejected_", rejected)):
        ids = torch.zeros(4, 14, dtype=torch.long)
        mask, labels = torch.zeros_like(ids), torch.full_like(ids, IGNORE_INDEX)
        for b, (n, response) in enumerate(zip(prompts, responses, strict=True)):
            seq = PROMPT[:n] + response
            ids[b, : len(seq)], mask[b, : len(seq)] = torch.tensor(seq), 1
            labels[b, n : len(seq)] = torch.tensor(response)
        out |= {f"{prefix}input_ids": ids, f"{prefix}attention_mask": mask}
        out[f"{prefix}labels"] = labels
    return out


def grads(model: torch.nn.Module, values: torch.Tensor) -> dict[str, torch.Tensor]:
    # weights of varied sign, so a gradient cannot cancel to the same sum by chance
    weights = torch.linspace(-1.0, 2.0, len(values))
    (values * weights).sum().backward()
    return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


CASES = [(kind, "sdpa", "dpo") for kind in sorted(sharing.MODEL_TYPES)] + [
    ("gpt2", "eager", "dpo"),
    ("gpt2", "sdpa", "orpo"),  # ORPO reads every attended token, the prompt's too
    ("llama", "eager", "orpo"),
]


@pytest.mark.parametrize(("kind", "attn", "loss"), CASES)
def test_shared_rows_give_the_log_probs_and_gradients_of_two_rows(
    kind: str, attn: str, loss: str
) -> None:
    two_rows = tiny(kind, attn).train()
    one_row = copy.deepcopy(two_rows)
    both = pref_losses.concatenated(pairs())
    index = pref_losses.read_positions(loss, both["labels"], both["attention_mask"])
    expected = pref_losses.token_logps(two_rows, both["input_ids"], both["attention_mask"], index)
    layout = sharing.shared(both, index)
    assert layout.input_ids.numel() < both["input_ids"].numel() * 3 // 4  # fewer tokens run
    got = pref_losses.token_logps(
        one_row,
        layout.input_ids,
        layout.attention_mask,
        layout.index,
        layout.targets,
        layout.position_ids,
    )
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    g_two, g_one = grads(two_rows, expected), grads(one_row, got)
    assert g_one.keys() == g_two.keys()
    for name, g in g_two.items():
        torch.testing.assert_close(g_one[name], g, rtol=1e-4, atol=1e-5, msg=name)


def test_the_layout_of_one_pair() -> None:
    """Chosen [1 2 3 4], rejected [1 2 5]: the row [1 2 3 4 5], token 5 at position 2,
    seeing 1, 2 and itself only."""
    both = {
        "input_ids": torch.tensor([[1, 2, 3, 4], [1, 2, 5, 0]]),
        "attention_mask": torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]]),
    }
    index = torch.tensor([1, 2, 5])  # chosen reads at 1, 2 (-> 3, 4); rejected at 1 (-> 5)
    layout = sharing.shared(both, index)
    assert layout.input_ids.tolist() == [[1, 2, 3, 4, 5]]
    assert layout.position_ids.tolist() == [[0, 1, 2, 3, 2]]
    assert layout.attention_mask[0, 4].tolist() == [True, True, False, False, True]
    assert layout.attention_mask[0, 3].tolist() == [True, True, True, True, False]
    assert layout.index.tolist() == [1, 2, 1]  # the rejected reads the shared position 1
    assert layout.targets.tolist() == [3, 4, 5]


def test_share_prefix_applies_by_model_type() -> None:
    class Model:
        def __init__(self, kind: str, **window: object) -> None:
            self.config = type("Config", (), {"model_type": kind, **window})()

    def resolved(setting: object, kind: str, **window: object) -> bool:
        task = family.build(Options(share_prefix=setting))
        return task._two_rows_why(Model(kind, **window)) is None

    assert resolved("auto", "gpt2") and resolved(True, "llama")
    assert resolved("auto", "qwen2", use_sliding_window=False, sliding_window=4096)
    assert not resolved("auto", "qwen2", use_sliding_window=True, sliding_window=4096)
    assert not resolved("auto", "phi3", sliding_window=2047)
    with pytest.raises(InputError, match=r"task\.share_prefix=true: this phi3 model attends"):
        resolved(True, "phi3", sliding_window=2047)
    task = family.build(Options())
    task.prepare_model(tiny("gpt2", "sdpa"), None)  # what the engine does with a built model
    inputs = task.module_inputs(pairs())
    assert inputs["attention_mask"].dim() == 3 and len(inputs["input_ids"]) == 4  # one row a pair
    assert not resolved("auto", "mistral") and not resolved(False, "gpt2")
    with pytest.raises(InputError, match=r"task\.share_prefix=true: a mistral model"):
        resolved(True, "mistral")


def _dpo_recipe(tmp_path: Path, backend: str) -> Path:
    write_pairs(tmp_path / "pairs.jsonl", 24)
    r = tiny_causal_lm("pairs.jsonl", backend=backend, max_steps=4, batch_size=4)
    r["task"] = {"name": "preference", "loss": "dpo", "beta": 0.5}
    r["data"].update(eval_fraction=0.25)
    r["export"] = {"enabled": False}
    return write_recipe(tmp_path / "dpo.yaml", r)


@pytest.mark.parametrize("backend", ["torch", pytest.param("ort", marks=pytest.mark.ort)])
def test_a_shared_run_has_the_losses_of_two_rows(tmp_path: Path, backend: str) -> None:
    """A DPO run (torch: unpadded too) shares by default, with the train and eval losses of
    ``task.share_prefix=false``; summary.json says which ran, and on how many tokens."""
    recipe = _dpo_recipe(tmp_path, backend)
    runs = {}
    for setting in ("auto", "false"):
        runs[setting] = tmp_path / setting
        res = run_cli("train", recipe, f"task.share_prefix={setting}", "--output-dir",
                      runs[setting], env={"NO_COLOR": "1"})  # fmt: skip
        assert res.returncode == 0, res.stderr[-2000:]
    shared, two = summary(runs["auto"]), summary(runs["false"])
    assert shared["data"]["share_prefix"]["on"] is True
    assert two["data"]["share_prefix"]["on"] is False
    assert two["data"]["share_prefix"]["why"] == "task.share_prefix=false"
    assert shared["data"]["share_prefix"]["why"] is None
    report = shared["data"]["share_prefix"]
    assert 0 < report["tokens_shared"] < report["tokens_two_rows"]
    assert shared["backend"]["used"] == backend and not shared["backend"]["fallback"]
    if backend == "torch":
        assert shared["backend"]["unpad"]["gathered_forwards"] > 0
    assert losses(runs["auto"]) == pytest.approx(losses(runs["false"]), rel=1e-4)
    eval_loss = shared["metrics"]["eval_loss"]
    assert eval_loss == pytest.approx(two["metrics"]["eval_loss"], rel=1e-4)
