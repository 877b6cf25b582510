"""The preference task as the core sees it: a causal LM (the generation family's decoder
hooks: its export with the KV cache, its card, ``ortft predict``) whose loss the engine
computes outside the wrapped module (``ScoresOutside``), against reference log-probs it
computes once on the freshly built model and caches (``ScoresReference`` with
``PreparesModel``; ``reference``)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from typing import Any

import numpy as np

from ortft.core.constants import IGNORE_INDEX
from ortft.core.errors import InputError
from ortft.data.batches import ALIGNED, Padding
from ortft.families.generation.family import DecoderHooks
from ortft.families.preference.task import REJECTED, TIE, Options, PairRows
from ortft.tasks.base import Encoded, Task

log = logging.getLogger("ortft")


class PreferenceTask(Task):
    """Pairs of a chosen and a rejected response to one prompt, scored by DPO, IPO or ORPO."""

    name = "preference"
    auto_class = "AutoModelForCausalLM"
    is_decoder = True
    shift_labels = True
    own_columns = True
    row_local = True
    needs_logits = True  # eval: each pair's rewards, for the preference metrics
    pads_unread = True  # backend.unpad applies: log-probs read the labeled positions only
    export_kind = "decoder"
    predicts = "generate"  # the input as a prompt, formatted as in training
    aligned_keys = ALIGNED + REJECTED
    eval_metrics = (
        "eval_loss",
        "eval_rewards_chosen",
        "eval_rewards_rejected",
        "eval_reward_accuracy",
        "eval_reward_margin",
    )

    def __init__(self, options: Options):
        self.options = options
        self.rows = PairRows(options)
        self._splits: list[tuple[str, Any]] = []  # the splits whose reference prepare fills
        self.shares_prefix = False  # task.share_prefix, resolved for the model (prepare_model)
        # summary.json's data.share_prefix: the data report is taken before the model is built,
        # and prepare_model adds whether the run shares to this same dict
        self._share_report: dict[str, Any] = {}

    @property
    def options_key(self) -> str:
        o = self.options  # what changes the arrays (the loss and beta do not)
        return "|".join(
            str(v)
            for v in (
                o.prompt_column,
                o.chosen_column,
                o.rejected_column,
                o.template,
                o.max_prompt_length,
                o.truncation,
            )
        )

    # ---- rows
    def columns(self, data: Any) -> list[str]:
        return [self.options.chosen_column, self.options.rejected_column]

    def read_columns(self, data: Any) -> list[str]:
        o = self.options
        return [o.prompt_column, o.chosen_column, o.rejected_column]

    def texts(self, rows: list[dict[str, Any]], data: Any) -> list[str]:
        return [text for i, r in enumerate(rows) for text in self.rows.texts(r, i)]

    def encode(self, rows, tokenizer, data, label2id) -> Encoded:
        return self.rows.encode(rows, tokenizer, data.max_length)

    def prompt(self, text: str, tokenizer: Any) -> str:
        """``ortft predict``: the text as a user turn, formatted as in training."""
        return self.rows.formatter.prompt(text, tokenizer)

    def recipe_problems(self, recipe: Any) -> Iterator[str]:
        if recipe.data.streaming:
            yield "data.streaming: the preference task reads its pairs whole (the reference "
            "log-probs are computed over a split before training)"

    # ---- the loss, outside the wrapped module
    def forward(
        self, model: Any, input_ids: Any, attention_mask: Any, labels: Any = None, **extra: Any
    ) -> Any:
        """The wrapped module's forward: the next-token log-probabilities of the positions
        ``extra["index"]`` names (the causal LM's graph, ending before any preference
        arithmetic)."""
        from ortft.families.preference.losses import token_logps

        return token_logps(
            model,
            input_ids,
            attention_mask,
            extra.get("index"),
            extra.get("targets"),
            extra.get("position_ids"),
        )

    def module_inputs(self, batch: dict[str, Any]) -> dict[str, Any]:
        """The pairs' sequences, chosen then rejected, and the positions the loss reads
        (found here, outside the wrapped module: its graph takes them as an input)."""
        from ortft.families.preference.losses import concatenated, read_positions

        both = concatenated(batch)
        index = read_positions(self.options.loss, both["labels"], both["attention_mask"])
        if self.shares_prefix:  # one row a pair (sharing.py): the same log-probs, in order
            from ortft.families.preference import sharing

            layout = sharing.shared(both, index)
            return dataclasses.asdict(layout)
        ids, mask = both["input_ids"], both["attention_mask"]
        return {"input_ids": ids, "attention_mask": mask, "index": index}

    def outside_loss(self, output: Any, batch: dict[str, Any]) -> tuple[Any, Any]:
        from ortft.families.preference.losses import (
            concatenated,
            preference_loss,
            read_positions,
            spread,
        )

        o = self.options
        both = concatenated(batch)
        index = read_positions(o.loss, both["labels"], both["attention_mask"])
        token = spread(output, index, *both["input_ids"].shape)
        scored: dict[str, Any] = dict(both)
        scored.update({k: batch[k] for k in ("ref_chosen", "ref_rejected") if k in batch})
        return preference_loss(o.loss, o.beta, o.label_smoothing, token, scored, o.sft_weight)

    def data_report(self, splits: dict[str, tuple[Any, Any]]) -> dict[str, Any]:
        """summary.json's data.share_prefix: the training pairs' real tokens as two rows a
        pair and as one (``task.share_prefix``); ``on`` and ``why`` are added when the model
        is built."""
        encoded = splits["train"][1]
        tokens = [encoded.column(f"{p}attention_mask") for p in ("", "rejected_")]
        ids = [encoded.column(f"{p}input_ids") for p in ("", "rejected_")]
        same = (ids[0] == ids[1]) & (tokens[0] != 0) & (tokens[1] != 0)
        two_rows = int(tokens[0].sum() + tokens[1].sum())
        self._share_report.update(
            tokens_two_rows=two_rows, tokens_shared=two_rows - int(np.cumprod(same, 1).sum())
        )
        return {"share_prefix": self._share_report}

    def counted(self, batch: dict[str, np.ndarray]) -> int:
        """Pairs (the loss is a mean over pairs; a padded eval copy has no chosen label)."""
        return int((np.asarray(batch["labels"]) != IGNORE_INDEX).any(axis=1).sum())

    def metrics(self, loss: float, logits: list[np.ndarray], labels: list[Any]) -> dict[str, Any]:
        """TRL's rewards/chosen, rewards/rejected, rewards/accuracies (chosen above rejected by
        more than ``TIE``: a tie is wrong) and rewards/margins, each a mean over the pairs."""
        rewards = np.concatenate([r for r in logits if r is not None]) if logits else None
        if rewards is None or not len(rewards):
            return {"loss": loss}
        margin = rewards[:, 0] - rewards[:, 1]
        return {
            "loss": loss,
            "rewards_chosen": float(rewards[:, 0].mean()),
            "rewards_rejected": float(rewards[:, 1].mean()),
            "reward_accuracy": float((margin > TIE).mean()),
            "reward_margin": float(margin.mean()),
        }

    def evaluate_saved(
        self, model: Any, encoded: Any, loaded: Any, batch_size: int
    ) -> dict[str, float]:
        """``ortft eval``: the loss and the reward metrics on a saved model (``saved``)."""
        from ortft.families.preference import saved

        return saved.evaluate(self, model, encoded, loaded, batch_size)

    def _two_rows_why(self, model: Any) -> str | None:
        """Why pairs run two rows with ``model``; None: they share their prefix. ``true``
        where sharing cannot apply is an input error."""
        from ortft.families.preference import sharing

        setting = self.options.share_prefix
        why_not = sharing.applies(model.config)
        if setting is True and why_not:
            raise InputError(
                f"task.share_prefix=true: {why_not} (it applies to "
                f"{', '.join(sorted(sharing.MODEL_TYPES))} without a sliding window; set it "
                "to auto or false)"
            )
        return "task.share_prefix=false" if setting is False else why_not

    # ---- the reference (DPO, IPO)
    def with_reference(self, train: Any, evals: Any, data: Any) -> tuple[Any, Any]:
        """The splits with the reference's columns, filled when the model is built and padded
        as ``data`` pads training's batches (ORPO has no reference: the splits as they are)."""
        if self.options.loss == "orpo":
            return train, evals
        from ortft.families.preference.reference import WithReference

        padding = Padding.of(data)
        out = [WithReference(s, padding) if s is not None else None for s in (train, evals)]
        self._splits = [(n, s) for n, s in zip(("train", "eval"), out, strict=True) if s]
        return out[0], out[1]

    def prepare_model(self, model: Any, processor: Any) -> None:
        """Whether pairs share their prefix (by the model's type), and, the freshly built
        model being the reference, each split's log-probs from it."""
        from ortft.families.preference.reference import fill, weights_hash

        why = self._two_rows_why(model)
        self.shares_prefix = why is None
        if "on" not in self._share_report:  # once (the auto probe builds several models)
            log.info(
                "preference: %s",
                "each pair runs as one sequence, its shared prefix once (task.share_prefix)"
                if self.shares_prefix
                else f"two rows a pair ({why})",
            )
        self._share_report.update(on=self.shares_prefix, why=why)
        weights = None  # hashed once for both splits (every parameter's bytes)
        for name, split in self._splits:
            if split.reference is None:
                weights = weights or weights_hash(model)
                fill(model, split, name, weights)


class PreferenceDecoder(PreferenceTask, DecoderHooks):
    """``PreferenceTask`` with the decoder's hooks (export, card, predict)."""

    def prompt(self, text: str, tokenizer: Any) -> str:
        return PreferenceTask.prompt(self, text, tokenizer)


def build(options: Options) -> PreferenceDecoder:
    return PreferenceDecoder(options)
