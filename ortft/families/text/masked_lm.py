"""masked-lm: BERT-style masked language modelling; loss and perplexity (over masked tokens).

Each text is one example, padded to max_length. Masking happens per batch, not at
tokenization: every epoch a fresh ``task.mlm_probability`` share of each row's tokens is
picked (80% become [MASK], 10% a random token, 10% stay), drawn from a generator seeded by
(seed, epoch, row), so a run, and a resumed run, masks identically. Eval uses one fixed
masking. Special tokens and padding are never picked.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field

from ortft.core.constants import IGNORE_INDEX
from ortft.core.errors import InputError
from ortft.core.reports import ExportReport, Prediction
from ortft.tasks.base import Encoded, Task, TaskOptions
from ortft.tasks.protocols import JsCall

EVAL_EPOCH = 1_000_003  # the fixed "epoch" of the eval masking


class Options(TaskOptions):
    name: Literal["masked-lm"] = "masked-lm"
    mlm_probability: Annotated[float, Field(gt=0.0, lt=1.0)] = Field(
        0.15,
        description="masked-lm: share of tokens selected for prediction (80% [MASK], 10% random, "
        "10% unchanged), drawn anew each epoch from the seed.",
    )


@dataclass
class MaskedLM(Task):
    probability: float = 0.15
    name = "masked-lm"
    pads_unread = True  # backend.unpad applies
    auto_class = "AutoModelForMaskedLM"
    export_kind = "per-token"
    predicts = "fill-mask"  # each [MASK] of the input text
    eval_metrics = ("eval_loss", "eval_perplexity")
    hf_architectures = ("MaskedLM",)

    def js_call(self, tokenizer: Any, report: ExportReport) -> JsCall | None:
        """transformers.js's ``fill-mask`` pipeline on the card's example (model card)."""
        from ortft.export import deploy

        mask = getattr(tokenizer, "mask_token", None) or "[MASK]"
        return "fill-mask", [deploy.EXAMPLE["fill-mask"].replace("[MASK]", mask)], {}

    @property
    def options_key(self) -> str:
        return f"{self.probability}"

    positions = "token"  # parity compares each position the attention mask keeps

    def predict_lines(
        self,
        model: Any,
        inputs: list[tuple[str, dict[str, Any]]],
        max_new_tokens: int,
        max_length: int | None,
        batch_size: int,
    ) -> Iterator[Prediction]:
        """Each text with its masks filled (``ortft predict``)."""
        from ortft.families.text import predict

        return predict.filled(model, inputs, max_length, batch_size)

    def encode(self, rows, tokenizer, data, label2id) -> Encoded:
        if tokenizer.mask_token_id is None:
            raise InputError("masked-lm needs a tokenizer with a mask token (e.g. a wordpiece one)")
        texts = [str(r[data.text_column]) for r in rows if str(r[data.text_column]).strip()]
        enc = tokenizer(
            texts,
            max_length=data.max_length,
            truncation=True,
            padding="max_length",
            return_special_tokens_mask=True,
            return_tensors="np",
        )
        ids = enc["input_ids"].astype(np.int64)
        mask = enc["attention_mask"].astype(np.int64)
        pickable = (mask == 1) & (enc["special_tokens_mask"] == 0)
        n = len(ids)
        return Encoded(
            {
                "input_ids": ids,
                "attention_mask": mask,
                # the candidates: the original token where it may be masked, else -100
                "labels": np.where(pickable, ids, IGNORE_INDEX),
                "_row": np.arange(n, dtype=np.int64),
                "_special": np.tile(
                    np.array([tokenizer.mask_token_id, len(tokenizer)], dtype=np.int64), (n, 1)
                ),
            }
        )

    def collate(
        self, batch: dict[str, np.ndarray], epoch: int | None, seed: int
    ) -> dict[str, np.ndarray]:
        """Mask this batch: the same row in the same epoch always gets the same masking
        (``epoch`` None: the eval masking)."""
        epoch = EVAL_EPOCH if epoch is None else epoch
        ids, candidates = batch["input_ids"].copy(), batch["labels"]
        mask_id, vocab = (int(v) for v in batch["_special"][0])
        labels = np.full_like(candidates, IGNORE_INDEX)
        for i, row in enumerate(batch["_row"]):
            rng = np.random.default_rng([seed, epoch, int(row)])
            u, kind, rand = (
                rng.random(ids.shape[1]),
                rng.random(ids.shape[1]),
                rng.integers(0, vocab, ids.shape[1]),
            )
            picked = (candidates[i] != IGNORE_INDEX) & (u < self.probability)
            labels[i] = np.where(picked, candidates[i], IGNORE_INDEX)
            ids[i] = np.where(picked & (kind < 0.8), mask_id, ids[i])
            ids[i] = np.where(picked & (kind >= 0.8) & (kind < 0.9), rand, ids[i])
        return {**batch, "input_ids": ids, "labels": labels}

    def metrics(
        self, loss: float, logits: list[np.ndarray], labels: list[np.ndarray]
    ) -> dict[str, Any]:
        return {"loss": loss, "perplexity": math.exp(min(loss, 50.0))}


def build(section: Options) -> MaskedLM:
    return MaskedLM(probability=section.mlm_probability)
