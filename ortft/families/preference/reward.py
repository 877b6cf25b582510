"""reward-model: a sequence classifier with one output (``AutoModelForSequenceClassification``,
``num_labels=1``) trained on the preference task's pairs with the Bradley-Terry loss of TRL
1.16.0's ``RewardTrainer.compute_loss``: ``-logsigmoid(r_chosen - r_rejected)``, plus
``center_rewards_coefficient`` times the mean of ``(r_chosen + r_rejected)**2`` when set.

The rows, their templates and truncation are the preference task's (``PairRows``). The chosen
and the rejected sequences go through the model in one forward (concatenated on the batch
dimension); the model scores each at its last token that is not the pad token, as transformers'
``*ForSequenceClassification`` does (the pad token is the config's ``pad_token_id``). The loss
is computed outside the wrapped module (``ScoresOutside``), so ORTModule's graph is the
classifier's own. The export is the sequence classifiers' single graph: ``logits`` [batch, 1].
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, Literal

import numpy as np
from pydantic import Field

from ortft.core.constants import IGNORE_INDEX
from ortft.core.errors import InputError
from ortft.core.reports import Prediction
from ortft.data.batches import ALIGNED
from ortft.families.preference.task import REJECTED, SEQUENCES, TIE, PairOptions, PairRows
from ortft.tasks.base import Encoded, Task

CARD = ("Write in digits: four two", "4 2")  # the model card's prompt and response
_CARD_RUN = """text = {text}  # the prompt as training formatted it, then the response
ids = np.array([tok.encode(text, add_special_tokens=False).ids], dtype=np.int64)
logits = session.run(["logits"], {{"input_ids": ids, "attention_mask": np.ones_like(ids)}})[0]
print(float(logits[0, 0]))  # the reward: the higher, the more preferred
"""


class Options(PairOptions):
    name: Literal["reward-model"] = "reward-model"
    center_rewards_coefficient: float = Field(
        0.0,
        ge=0,
        description="reward-model: add this times the mean of (r_chosen + r_rejected)^2, which "
        "keeps the rewards centred on 0 (TRL's RewardConfig.center_rewards_coefficient; "
        "0: off).",
    )


class RewardModel(Task):
    """Pairs of a chosen and a rejected response, each scored by a one-output head."""

    name = "reward-model"
    auto_class = "AutoModelForSequenceClassification"
    own_columns = True
    row_local = True
    needs_logits = True  # eval: each pair's rewards, for the metrics
    predicts = "reward"  # a response's reward; a pair's two and which is preferred
    peft_task_type = "SEQ_CLS"  # LoRA: peft's sequence classifier (its head trains in full)
    aligned_keys = ALIGNED + REJECTED
    eval_metrics = (
        "eval_loss",
        "eval_accuracy",
        "eval_margin",
        "eval_rewards_chosen",
        "eval_rewards_rejected",
    )

    def __init__(self, options: Options):
        self.options = options
        self.rows = PairRows(options)

    @property
    def options_key(self) -> str:
        o = self.options  # what changes the arrays (the coefficient does not)
        keys = (o.prompt_column, o.chosen_column, o.rejected_column, o.template)
        return "|".join(str(v) for v in (*keys, o.max_prompt_length, o.truncation))

    # ---- rows
    def columns(self, data: Any) -> list[str]:
        return [self.options.chosen_column, self.options.rejected_column]

    def read_columns(self, data: Any) -> list[str]:
        o = self.options
        return [o.prompt_column, o.chosen_column, o.rejected_column]

    def texts(self, rows: list[dict[str, Any]], data: Any) -> list[str]:
        return [text for i, r in enumerate(rows) for text in self.rows.texts(r, i)]

    def label_names(self, rows: Any, data: Any) -> list[str]:
        """One output, the reward (the head's ``num_labels``)."""
        return ["reward"]

    def encode(self, rows, tokenizer, data, label2id) -> Encoded:
        return self.rows.encode(rows, tokenizer, data.max_length)

    def recipe_problems(self, recipe: Any) -> Iterator[str]:
        if recipe.backend.name == "auto":
            yield (
                "backend.name: the reward-model task trains on torch or ort (auto's probe times "
                "the classifier's own loss, not the pair loss)"
            )
        if recipe.data.streaming:
            yield "data.streaming: the reward-model task reads its pairs whole"

    def prepare_model(self, model: Any, processor: Any) -> None:
        """The score is read at the last token that is not the pad token: the config must name
        the tokenizer's. ``problem_type`` is set as transformers' first forward would set it
        (a compiled forward guards on the config)."""
        if model.config.pad_token_id is None:
            model.config.pad_token_id = processor.pad_token_id
        model.config.problem_type = "regression"
        zero_new_head(model)

    # ---- the loss, outside the wrapped module
    def forward(
        self, model: Any, input_ids: Any, attention_mask: Any, labels: Any = None, **extra: Any
    ) -> Any:
        """The wrapped module's forward: each sequence's reward, [rows, 1]."""
        return model(input_ids=input_ids, attention_mask=attention_mask, return_dict=True).logits

    def module_inputs(self, batch: dict[str, Any]) -> dict[str, Any]:
        import torch

        return {
            k: torch.cat([batch[k], batch[f"rejected_{k}"]], 0)
            for k in ("input_ids", "attention_mask")
        }

    def outside_loss(self, output: Any, batch: dict[str, Any]) -> tuple[Any, Any]:
        return reward_loss(output, batch["labels"], self.options.center_rewards_coefficient)

    def counted(self, batch: dict[str, np.ndarray]) -> int:
        """Pairs (the loss is a mean over pairs; a padded eval copy has no chosen label)."""
        return int((np.asarray(batch["labels"]) != IGNORE_INDEX).any(axis=1).sum())

    def metrics(self, loss: float, logits: list[np.ndarray], labels: list[Any]) -> dict[str, Any]:
        """TRL's accuracy (chosen above rejected by more than ``TIE``: a tie is wrong) and
        margin, and the mean rewards, over the pairs."""
        rewards = np.concatenate([r for r in logits if r is not None]) if logits else None
        if rewards is None or not len(rewards):
            return {"loss": loss}
        margin = rewards[:, 0] - rewards[:, 1]
        return {
            "loss": loss,
            "accuracy": float((margin > TIE).mean()),
            "margin": float(margin.mean()),
            "rewards_chosen": float(rewards[:, 0].mean()),
            "rewards_rejected": float(rewards[:, 1].mean()),
        }

    def evaluate_saved(
        self, model: Any, encoded: Any, loaded: Any, batch_size: int
    ) -> dict[str, float]:
        """``ortft eval``: the loss and the metrics on a saved model (PyTorch or its export)."""
        import torch

        from ortft.data.batches import eval_batches

        total, weight, rewards = 0.0, 0, []
        for batch in eval_batches(encoded, batch_size):
            scores = [
                model.logits(batch[f"{p}input_ids"], batch[f"{p}attention_mask"]) for p in SEQUENCES
            ]
            output = torch.from_numpy(np.concatenate(scores)).float()
            labels = torch.from_numpy(np.asarray(batch["labels"]))
            loss, pair_rewards = reward_loss(
                output, labels, self.options.center_rewards_coefficient
            )
            n = self.counted(batch)
            total, weight = total + float(loss) * n, weight + n
            rewards.append(pair_rewards[: int(batch["_valid"])].numpy())
        return self.metrics(total / max(weight, 1), rewards, [])

    # ---- the export's model card
    def snippet(self, tokenizer: Any, report: Any) -> str:
        """The card's code: the example prompt and response formatted as in training, scored."""
        from ortft.export import deploy

        chat = [{"role": "user", "content": CARD[0]}, {"role": "assistant", "content": CARD[1]}]
        text = "".join(self.rows._split(chat, 0, tokenizer))
        return deploy.head() + _CARD_RUN.format(text=json.dumps(text, ensure_ascii=False))

    # ---- ortft predict
    def predict_lines(
        self,
        model: Any,
        inputs: list[tuple[str, dict[str, Any]]],
        max_new_tokens: int,
        max_length: int | None,
        batch_size: int,
    ) -> Iterator[Prediction]:
        """A pair row (the task's chosen and rejected columns): both rewards, their margin and
        the preferred one; a ``{prompt, response}`` or ``{messages}`` row, or a plain line (the
        text as it is, already formatted): its reward."""
        from ortft.inference.predict import input_length

        limit = input_length(model, max_length)
        sequences = [self._sequences(where, obj, model.tokenizer, limit) for where, obj in inputs]
        flat = [ids for seqs in sequences for ids in seqs]
        if not flat:
            return
        scores = np.concatenate(
            [
                _score(model, flat[start : start + batch_size])
                for start in range(0, len(flat), batch_size)
            ]
        )
        at = 0
        for index, seqs in enumerate(sequences):
            if len(seqs) == 1:
                yield {"index": index, "reward": float(scores[at])}
            else:
                chosen, rejected = float(scores[at]), float(scores[at + 1])
                margin = chosen - rejected
                preferred = "tie" if abs(margin) <= TIE else "chosen" if margin > 0 else "rejected"
                yield {
                    "index": index,
                    "reward_chosen": chosen,
                    "reward_rejected": rejected,
                    "margin": margin,
                    "preferred": preferred,
                }
            at += len(seqs)

    def _sequences(
        self, where: str, obj: dict[str, Any], tokenizer: Any, limit: int
    ) -> list[list[int]]:
        """The token ids of the row's one or two sequences, formatted as training's."""
        o = self.options
        try:
            if o.chosen_column in obj or o.rejected_column in obj:
                return [
                    self.rows.sequence(c, 0, tokenizer, limit)[0]
                    for c in self.rows.conversations(obj, 0)
                ]
            if "response" in obj or "messages" in obj:
                return [self.rows.sequence(self._chat(obj), 0, tokenizer, limit)[0]]
        except InputError as err:  # "row 1: ..." names the input line instead
            raise InputError(f"{where}: {str(err).removeprefix('row 1: ')}") from None
        if "text" not in obj:
            raise InputError(
                f"{where}: give {o.chosen_column} and {o.rejected_column} (a pair), prompt and "
                "response, messages, or text (has: " + ", ".join(sorted(map(str, obj))) + ")"
            )
        ids = tokenizer(str(obj["text"]), add_special_tokens=False)["input_ids"][:limit]
        if not ids:
            raise InputError(f"{where}: the text is empty")
        return [ids]

    def _chat(self, obj: dict[str, Any]) -> list[dict]:
        """A ``{prompt, response}`` row (the prompt a string or messages) or ``{messages}``."""
        if "messages" in obj:
            chat = self.rows.formatter._messages({"messages": obj["messages"]}, 0)
            if chat[-1]["role"] != "assistant":
                raise InputError("row 1: messages must end with the assistant's response")
            return chat
        prompt = obj.get(self.options.prompt_column)
        if prompt is None:
            raise InputError(f"row 1: a response needs its {self.options.prompt_column}")
        shared = [{"role": "user", "content": str(prompt)}] if isinstance(prompt, str) else prompt
        chat = [*shared, {"role": "assistant", "content": str(obj["response"])}]
        return self.rows.formatter._messages({"messages": chat}, 0)


def reward_loss(output: Any, labels: Any, center: float = 0.0) -> tuple[Any, Any]:
    """(the mean Bradley-Terry loss over the batch's pairs, the [pairs, 2] chosen and rejected
    rewards) from ``output``, the model's [2 x pairs, 1] rewards, the chosen then the rejected;
    ``labels``: the chosen sequences' (a padded eval copy has none, and weighs nothing)."""
    import torch
    import torch.nn.functional as F

    rewards = output.float().squeeze(-1)
    chosen, rejected = rewards.chunk(2)
    weight = (labels != IGNORE_INDEX).any(1).to(rewards.dtype)
    mean = weight / weight.sum().clamp(min=1.0)
    loss = -(F.logsigmoid(chosen - rejected) * mean).sum()
    if center:  # TRL: the mean over the pairs of (r_chosen + r_rejected)^2
        loss = loss + center * (((chosen + rejected) ** 2) * mean).sum()
    return loss, torch.stack([chosen, rejected], 1).detach()


def zero_new_head(model: Any) -> bool:
    """Start a new score head at zero (a trained one, loaded with the model, is kept): before
    training every pair ties, which counts as wrong, so an untrained model scores accuracy 0
    rather than what a random direction in the features happens to give. Only the head's last
    linear layer is zeroed (RoBERTa's head has a dense layer before it), so the body's gradient
    is zero at the first step only. True when it zeroed one."""
    import torch

    from ortft.backends.torch import load_checks

    record = load_checks.head_record(model)  # None: a model built from a config, all new
    if record is not None and record["action"] not in ("new", "reinitialised"):
        return False
    head = getattr(model, "score", None) or getattr(model, "classifier", None)
    last = head if isinstance(head, torch.nn.Linear) else getattr(head, "out_proj", None)
    if not isinstance(last, torch.nn.Linear):
        return False
    with torch.no_grad():
        last.weight.zero_()
        if last.bias is not None:
            last.bias.zero_()
    return True


def _score(model: Any, seqs: list[list[int]]) -> np.ndarray:
    """Each sequence's reward: the batch padded at the end with the pad token."""
    pad = model.tokenizer.pad_token_id if model.tokenizer.pad_token_id is not None else 0
    length = max(len(s) for s in seqs)
    ids = np.full((len(seqs), length), pad, dtype=np.int64)
    mask = np.zeros((len(seqs), length), dtype=np.int64)
    for b, s in enumerate(seqs):
        ids[b, : len(s)], mask[b, : len(s)] = s, 1
    return model.logits(ids, mask)[:, 0]


def build(options: Options) -> RewardModel:
    return RewardModel(options)
