"""The preference losses equal TRL 1.16.0's, loss and gradients, on one model, batch and set of
reference log-probs: DPO (``DPOConfig(loss_type="sigmoid")``), IPO (``loss_type="ipo"``) and
ORPO (``trl.experimental.orpo``), each through a tiny offline TRL trainer."""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
import torch

from ortft.families.preference.family import PreferenceTask
from ortft.families.preference.losses import concatenated, preference_loss, token_logps
from ortft.families.preference.task import Options, PairRows
from ortft.tasks.base import Encoded
from ortft.tasks.lm_head import HEAD_ROWS

ROWS = [
    {"prompt": "the cat", "chosen": "sat on the mat", "rejected": "ran"},
    {"prompt": "birds sang", "chosen": "over trees", "rejected": "in parks and over the mat"},
    {"prompt": "dogs ran in", "chosen": "parks", "rejected": "the mat while birds sang"},
]
REF = torch.tensor([[-31.5, -12.25], [-20.0, -44.0], [-9.5, -41.0]])  # reference sums


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

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
    config = GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=len(tokenizer))
    model = GPT2LMHeadModel(config).eval()  # no dropout: both sides see one function
    encoded: Encoded = PairRows(Options()).encode(ROWS, tokenizer, 40)
    batch = {k: torch.from_numpy(v) for k, v in encoded.arrays.items() if k != "_length"}
    return tokenizer, model, batch, tmp_path_factory.mktemp("trl")


def _ortft(kind: str, model, batch, beta: float = 0.1, sft_weight: float = 0.0):
    """The loss as a training step computes it: the family's wrapped forward (the head at the
    positions the loss reads, ``module_inputs``' index) and its loss outside the module."""
    task = PreferenceTask(Options(loss=kind, beta=beta, sft_weight=sft_weight))
    full = {**batch, "ref_chosen": REF[:, 0], "ref_rejected": REF[:, 1]}
    inputs = task.module_inputs(full)
    rows: list[int] = []
    hook = model.lm_head.register_forward_hook(lambda m, args, out: rows.append(len(args[0])))
    output = task.forward(model, **inputs)
    hook.remove()
    loss, _ = task.outside_loss(output, full)
    loss.backward()
    # the head ran once, at the positions read only (ORPO's: every attended token's), in
    # whole blocks of rows (lm_head.HEAD_ROWS)
    read = len(inputs["index"])
    assert rows == [-(-read // HEAD_ROWS) * HEAD_ROWS] and rows[0] < inputs["input_ids"].numel()
    return loss


def _trl_dpo(loss_type: str, model, batch, tokenizer, out: Path, sft_weight: float = 0.0):
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    os.environ.setdefault("TQDM_DISABLE", "1")
    args = DPOConfig(
        output_dir=str(out),
        report_to=[],
        loss_type=[loss_type, "sft"] if sft_weight else [loss_type],
        loss_weights=[1.0, sft_weight] if sft_weight else None,
        beta=0.1,
        precompute_ref_log_probs=True,
        use_cpu=True,
    )
    trainer = DPOTrainer(
        model=model, args=args, train_dataset=Dataset.from_list(ROWS), processing_class=tokenizer
    )
    both = concatenated(batch)
    inputs = {
        "input_ids": both["input_ids"],
        "attention_mask": both["attention_mask"],
        # TRL's completion mask is unshifted: it marks the response tokens themselves
        "completion_mask": (both["labels"] != -100).long(),
        "ref_chosen_logps": REF[:, 0],
        "ref_rejected_logps": REF[:, 1],
    }
    trainer.model.eval()
    loss = trainer._compute_loss(trainer.model, inputs, False)
    loss.backward()
    return loss, trainer.model


def _trl_orpo(model, batch, tokenizer, out: Path):
    from datasets import Dataset
    from trl.experimental.orpo import ORPOConfig, ORPOTrainer

    args = ORPOConfig(output_dir=str(out), report_to=[], beta=0.1, use_cpu=True)
    trainer = ORPOTrainer(
        model=model, args=args, train_dataset=Dataset.from_list(ROWS), processing_class=tokenizer
    )
    inputs = {}
    for prefix, name in (("", "chosen"), ("rejected_", "rejected")):
        for key in ("input_ids", "attention_mask", "labels"):
            inputs[f"{name}_{key}"] = batch[f"{prefix}{key}"]
    trainer.model.eval()
    loss, _ = trainer.get_batch_loss_metrics(trainer.model, inputs)
    loss.backward()
    return loss, trainer.model


def _same_gradients(ours, theirs) -> None:
    theirs_grads = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():
        g = theirs_grads[name].grad
        assert p.grad is not None and g is not None, name
        torch.testing.assert_close(p.grad, g, atol=1e-5, rtol=1e-5, msg=name)


@pytest.mark.parametrize(
    "kind, sft_weight", [("dpo", 0.0), ("ipo", 0.0), ("orpo", 0.0), ("dpo", 0.7), ("ipo", 0.7)]
)
def test_loss_and_gradients_equal_trl(setup, kind: str, sft_weight: float) -> None:
    """task.sft_weight w: TRL's loss_type [sigmoid (or ipo), sft] with loss_weights [1, w]."""
    tokenizer, model, batch, out = setup
    ours, theirs = copy.deepcopy(model), copy.deepcopy(model)
    loss = _ortft(kind, ours, batch, sft_weight=sft_weight)
    folder = out / f"{kind}-{sft_weight}"
    if kind == "orpo":
        trl_loss, trained = _trl_orpo(theirs, batch, tokenizer, folder)
    else:
        loss_type = {"dpo": "sigmoid", "ipo": "ipo"}[kind]
        trl_loss, trained = _trl_dpo(loss_type, theirs, batch, tokenizer, folder, sft_weight)
    assert abs(float(loss) - float(trl_loss)) <= 1e-5, (float(loss), float(trl_loss))
    assert float(loss) != 0.0
    _same_gradients(ours, trained)


def test_conservative_dpo_mixes_the_pair_and_its_flip(setup) -> None:
    """TRL 1.16's sigmoid loss has no label smoothing; the conservative DPO ortft's
    ``label_smoothing`` gives is (1 - eps) x DPO + eps x DPO of the flipped pair."""
    _, model, batch, _ = setup
    both = concatenated(batch)
    with torch.no_grad():
        token = token_logps(model, both["input_ids"], both["attention_mask"])
    pairs = len(REF)
    flipped_token = torch.cat([token[pairs:], token[:pairs]])
    flipped_labels = torch.cat([both["labels"][pairs:], both["labels"][:pairs]])

    def dpo(eps: float, tok, labels, ref) -> float:
        scored = {**both, "labels": labels, "ref_chosen": ref[:, 0], "ref_rejected": ref[:, 1]}
        return float(preference_loss("dpo", 0.1, eps, tok, scored)[0])

    plain = dpo(0.0, token, both["labels"], REF)
    flipped = dpo(0.0, flipped_token, flipped_labels, REF.flip(1))
    mixed = dpo(0.2, token, both["labels"], REF)
    assert mixed == pytest.approx(0.8 * plain + 0.2 * flipped, abs=1e-6)
    assert abs(mixed - plain) > 1e-4
