"""The reward-model loss equals TRL 1.16.0's ``RewardTrainer.compute_loss``, loss and gradients,
on one model and batch: the Bradley-Terry loss, with and without
``center_rewards_coefficient``, through a tiny offline TRL trainer (as the DPO tests build theirs)."""

from __future__ import annotations

import copy
import os

import pytest
import torch

from ortft.families.preference.reward import Options, RewardModel
from ortft.tasks.base import Encoded

ROWS = [
    {"prompt": "the cat", "chosen": "sat on the mat", "rejected": "ran"},
    {"prompt": "birds sang", "chosen": "over trees", "rejected": "in parks and over the mat"},
    {"prompt": "dogs ran in", "chosen": "parks", "rejected": "the mat while birds sang"},
]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2ForSequenceClassification, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel()
    texts = [" ".join(r.values()) for r in ROWS] * 4
    tok.train_from_iterator(
        texts, trainers.BpeTrainer(vocab_size=120, special_tokens=["<|endoftext|>"])
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>"
    )
    torch.manual_seed(0)
    config = GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=len(tokenizer), num_labels=1)
    config.pad_token_id = tokenizer.pad_token_id
    model = GPT2ForSequenceClassification(config).eval()  # no dropout: one function both sides
    with torch.no_grad():  # a head far from zero: rewards that differ, a loss far from ln 2
        model.score.weight.normal_(0, 1.0)
    encoded: Encoded = RewardModel(Options()).rows.encode(ROWS, tokenizer, 40)
    batch = {k: torch.from_numpy(v) for k, v in encoded.arrays.items() if k != "_length"}
    return tokenizer, model, batch, tmp_path_factory.mktemp("trl-reward")


def _ortft(model, batch, center: float):
    task = RewardModel(Options(center_rewards_coefficient=center))
    output = task.forward(model, **task.module_inputs(batch))
    loss, rewards = task.outside_loss(output, batch)
    loss.backward()
    return loss, rewards


def _trl(model, batch, tokenizer, out, center: float):
    from datasets import Dataset
    from trl import RewardConfig, RewardTrainer

    os.environ.setdefault("TQDM_DISABLE", "1")
    args = RewardConfig(
        output_dir=str(out),
        report_to=[],
        center_rewards_coefficient=center or None,  # TRL's off is None
        use_cpu=True,
    )
    trainer = RewardTrainer(
        model=model, args=args, train_dataset=Dataset.from_list(ROWS), processing_class=tokenizer
    )
    inputs = {  # TRL's collator: the chosen sequences, then the rejected ones
        k: torch.cat([batch[k], batch[f"rejected_{k}"]]) for k in ("input_ids", "attention_mask")
    }
    trainer.model.eval()
    loss = trainer.compute_loss(trainer.model, inputs)
    loss.backward()
    return loss, trainer.model


@pytest.mark.parametrize("center", [0.0, 0.05])
def test_reward_loss_and_gradients_equal_trl(setup, center: float) -> None:
    tokenizer, model, batch, out = setup
    ours, theirs = copy.deepcopy(model), copy.deepcopy(model)
    loss, rewards = _ortft(ours, batch, center)
    trl_loss, trained = _trl(theirs, batch, tokenizer, out / str(center), center)
    assert abs(float(loss) - float(trl_loss)) <= 1e-5, (float(loss), float(trl_loss))
    assert abs(float(loss) - 0.6931) > 1e-2  # not the untrained head's ln 2
    assert (rewards[:, 0] - rewards[:, 1]).abs().min() > 1e-3  # the pairs' rewards differ
    grads = dict(trained.named_parameters())
    for name, p in ours.named_parameters():
        g = grads[name].grad
        assert p.grad is not None and g is not None, name
        torch.testing.assert_close(p.grad, g, atol=1e-5, rtol=1e-5, msg=name)


def test_the_reward_is_read_at_the_last_real_token(setup) -> None:
    """Each sequence's reward in the padded pair batch is the reward of its tokens alone."""
    _, model, batch, _ = setup
    task = RewardModel(Options())
    with torch.no_grad():
        rewards = task.forward(model, **task.module_inputs(batch))[:, 0]
        both = task.module_inputs(batch)
        for row, (ids, mask) in enumerate(
            zip(both["input_ids"], both["attention_mask"], strict=True)
        ):
            alone = ids[: int(mask.sum())][None]
            assert alone.shape[1] < ids.shape[0]  # the batch row is padded
            own = model(input_ids=alone, attention_mask=torch.ones_like(alone)).logits[0, 0]
            torch.testing.assert_close(rewards[row], own, atol=1e-5, rtol=1e-5)
