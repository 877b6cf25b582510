"""The causal LM head run only where the loss reads it (``ortft.tasks.lm_head``): which models
it splits, and that the values at those positions are transformers' own (the tasks' own tests
compare their losses: test_vision_language.py, test_preference_losses.py)."""

from __future__ import annotations

import pytest
import torch

from ortft.families.preference.losses import read_positions, spread, token_logps
from ortft.tasks import lm_head


def _gpt2() -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=50)).eval()


def _gemma2() -> torch.nn.Module:
    """A model whose logits are soft-capped after the head: not a plain head."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    torch.manual_seed(0)
    config = Gemma2Config(
        vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, head_dim=8, final_logit_softcapping=2.0,
    )  # fmt: skip
    return Gemma2ForCausalLM(config).eval()


def _batch() -> dict[str, torch.Tensor]:
    ids = torch.randint(1, 50, (3, 9))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0  # a right-padded row
    labels = torch.full_like(ids, -100)
    labels[:, 5:] = ids[:, 5:]
    labels[1, 6:] = -100
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def test_split_takes_plain_heads_only_and_sees_through_peft() -> None:
    import peft

    gpt2 = _gpt2()
    assert lm_head.split(gpt2) == (gpt2.transformer, gpt2.lm_head)
    lora = peft.get_peft_model(_gpt2(), peft.LoraConfig(target_modules=["c_attn"]))
    body, head = lm_head.split(lora) or (None, None)
    assert head is lora.get_base_model().lm_head and body is lora.get_base_model().transformer
    assert lm_head.split(_gemma2()) is None  # soft-capped logits: transformers' own forward


def test_positions_are_those_whose_next_token_counts() -> None:
    b = _batch()
    index = lm_head.label_positions(b["labels"])
    # row 0: tokens 5..8 are labelled, so positions 4..7 predict them; row 1: 5 only
    assert index.tolist() == [4, 5, 6, 7, 9 + 4, 18 + 4, 18 + 5, 18 + 6, 18 + 7]
    attended = read_positions("orpo", b["labels"], b["attention_mask"])
    assert len(attended) == int(b["attention_mask"][:, 1:].sum())


@pytest.mark.parametrize("build", [_gpt2, _gemma2])
def test_token_logps_at_the_positions_equal_the_full_forwards(build) -> None:
    """Split (GPT-2) or not (Gemma 2, transformers' forward then the positions picked): the
    values at the positions read are the full forward's, and ``spread`` puts them back."""
    model, b = build(), _batch()
    with torch.no_grad():
        full = token_logps(model, b["input_ids"], b["attention_mask"])
        for kind in ("dpo", "orpo"):
            index = read_positions(kind, b["labels"], b["attention_mask"])
            part = token_logps(model, b["input_ids"], b["attention_mask"], index)
            laid = spread(part, index, *b["input_ids"].shape)
            counted = torch.zeros(b["input_ids"].numel(), dtype=torch.bool)
            counted[index] = True
            counted = counted.view(b["input_ids"].shape)[:, :-1]
            torch.testing.assert_close(laid[counted], full[counted], atol=1e-6, rtol=1e-5)
            assert bool((laid[~counted] == 0).all()) and len(part) == int(counted.sum())


def test_next_token_loss_is_transformers_causal_lm_loss() -> None:
    model, b = _gpt2(), _batch()
    with torch.no_grad():
        want = model(**b).loss
        hidden = model.transformer(
            input_ids=b["input_ids"], attention_mask=b["attention_mask"]
        ).last_hidden_state
        loss, logits = lm_head.next_token_loss(model.lm_head, hidden, b["labels"], None)
    torch.testing.assert_close(loss, want)
    assert logits.shape == (int((b["labels"][:, 1:] != -100).sum()), 50)


@pytest.mark.parametrize("build", [_gpt2, _gemma2])
def test_the_causal_lm_forward_is_transformers_loss_with_the_head_at_the_labels(build) -> None:
    """causal-lm and instruction (``HeadAtLabels``): the loss of transformers' forward; on a
    plain head (GPT-2) the head runs at the labelled positions only, with the positions found
    before the module or in it."""
    from ortft.families.generation.family import CausalDecoder

    model, b, task = build(), _batch(), CausalDecoder()
    rows: list[int] = []
    head = model.get_output_embeddings()
    hook = head.register_forward_hook(lambda m, args, out: rows.append(args[0].shape[0]))
    with torch.no_grad():
        want = model(**b, use_cache=False).loss
        outside, _ = task.forward(model, **task.outside_inputs(b))
        inside, logits = task.forward(model, **b)
    hook.remove()
    torch.testing.assert_close(outside, want)
    torch.testing.assert_close(inside, want)
    if build is _gpt2:  # 9 labelled positions of 27, run as 16 rows (lm_head.HEAD_ROWS)
        assert rows[1:] == [16, 16] and logits.shape == (9, 50)


def test_the_head_runs_on_whole_blocks_of_rows_with_the_values_and_gradients_of_the_positions():
    """``project`` pads the positions to a multiple of HEAD_ROWS rows (oneDNN builds a bf16
    kernel per matrix height) and drops the padding's logits: the logits and the gradients of
    the head and the hidden states are those of the head at the positions alone (to float32's
    rounding: a GEMM of another height may round its last bit otherwise)."""
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 11, bias=False)
    hidden = torch.randn(3, 7, 8, requires_grad=True)
    for index in (torch.tensor([0, 4, 9, 20]), torch.arange(16), torch.arange(17)):
        weights = torch.randn(len(index), 11)
        got = lm_head.project(head, hidden, index)
        (got * weights).sum().backward()
        grads = hidden.grad.clone(), head.weight.grad.clone()
        hidden.grad, head.weight.grad = None, None
        want = head(lm_head.at(hidden, index))
        (want * weights).sum().backward()
        torch.testing.assert_close(got, want)  # another matrix height: the last bit may differ
        torch.testing.assert_close(grads, (hidden.grad, head.weight.grad))
        hidden.grad, head.weight.grad = None, None
    seen: list[int] = []
    hook = head.register_forward_hook(lambda m, args, out: seen.append(args[0].shape[0]))
    for n in (1, 4, 16, 17):
        lm_head.project(head, hidden, torch.arange(n))
    hook.remove()
    assert seen == [16, 16, 16, 32]


def test_a_compiled_head_serves_every_count_of_positions_with_one_graph() -> None:
    """Under torch.compile (dynamic shapes) the head runs unpadded: padding to HEAD_ROWS made
    dynamo specialize the padding's length and compile again for some counts."""
    from ortft.backends.torch import compiled

    torch._dynamo.reset()
    head = torch.nn.Linear(8, 11, bias=False)
    hidden = torch.randn(3, 7, 8)
    step = torch.compile(
        lambda h, i: lm_head.project(head, h, i), backend="aot_eager", dynamic=True
    )
    before = compiled.graphs_compiled()
    for n in (5, 16, 17, 15, 6):
        torch.testing.assert_close(step(hidden, torch.arange(n)), head(hidden.reshape(21, 8)[:n]))
    assert compiled.graphs_compiled() - before == 1
    torch._dynamo.reset()
