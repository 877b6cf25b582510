"""token-classification: one tag per word (NER, POS); token accuracy, entity F1 and macro-F1.

Data: rows with a list of words (``task.tokens_column``, default ``tokens``) and one tag per
word (``task.tags_column``, default ``tags``). Words are tokenized with
``is_split_into_words``; the first sub-token of each word carries the word's tag, the other
sub-tokens and the special tokens get -100, so the loss and the metrics count each word once.

Metrics: ``accuracy`` over labelled words. When the tags are BIO/IOB2 (``B-X`` / ``I-X`` /
``O``): ``precision``, ``recall`` and ``f1`` are seqeval's entity-level scores
(``seqeval.metrics``, default mode: conlleval's chunking, a stray ``I-X`` starts an entity;
micro-averaged over entity types). A tag set that is not BIO has no entities: ``f1`` is then the
macro-F1 over tags. ``f1_macro`` is always ortft's macro-F1 over tags (the unweighted mean of
each tag's F1 over words, ``ortft.tasks.metrics.macro_f1``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from pydantic import Field

from ortft.core.constants import IGNORE_INDEX
from ortft.core.errors import InputError
from ortft.core.reports import ExportReport, Prediction
from ortft.tasks.base import Encoded, Task, TaskOptions
from ortft.tasks.metrics import macro_f1
from ortft.tasks.protocols import JsCall


class Options(TaskOptions):
    name: Literal["token-classification"] = "token-classification"
    # one tag per word; the first sub-token of a word carries its tag
    tokens_column: str = Field(
        "tokens", description="token-classification: column with the list of words."
    )
    tags_column: str = Field(
        "tags", description="token-classification: column with one tag per word."
    )


@dataclass
class TokenClassification(Task):
    tokens_column: str = "tokens"
    tags_column: str = "tags"
    id2label: list[str] = field(default_factory=list)  # set by label_names(), read by metrics()
    name = "token-classification"
    pads_unread = True  # backend.unpad applies
    auto_class = "AutoModelForTokenClassification"
    row_local = True  # each row tokenized on its own
    needs_labels = True
    needs_logits = True
    own_columns = True
    export_kind = "per-token"
    predicts = "tags"
    eval_metrics = ("eval_loss", "eval_accuracy", "eval_f1", "eval_f1_macro")
    hf_architectures = ("TokenClassification",)

    def js_call(self, tokenizer: Any, report: ExportReport) -> JsCall | None:
        """transformers.js's ``token-classification`` pipeline on the card's example (model card)."""
        from ortft.export import deploy

        return "token-classification", [deploy.EXAMPLE["tags"]], {}

    @property
    def options_key(self) -> str:
        return f"{self.tokens_column}|{self.tags_column}"

    def columns(self, data: Any) -> list[str]:
        return [self.tokens_column, self.tags_column]

    def _words(self, row: dict[str, Any], i: int) -> tuple[list[str], list[str]]:
        words, tags = row[self.tokens_column], row[self.tags_column]
        if not isinstance(words, list) or not isinstance(tags, list):
            raise InputError(
                f"row {i + 1}: {self.tokens_column} and {self.tags_column} must be lists"
            )
        if len(words) != len(tags):
            raise InputError(
                f"row {i + 1}: {len(words)} {self.tokens_column} but {len(tags)} "
                f"{self.tags_column}; give one tag per word"
            )
        return [str(w) for w in words], [str(t) for t in tags]

    def texts(self, rows: list[dict[str, Any]], data: Any) -> list[str]:
        return [" ".join(self._words(r, i)[0]) for i, r in enumerate(rows)]

    def label_names(self, rows: list[dict[str, Any]], data: Any) -> list[str]:
        names = (
            list(data.label_names)
            if data.label_names
            else sorted({t for i, r in enumerate(rows) for t in self._words(r, i)[1]})
        )
        self.bind_labels(names)
        return names

    def bind_labels(self, names: list[str]) -> None:
        self.id2label = list(names)

    positions = "token"  # parity compares each position the attention mask keeps

    def predict_lines(
        self,
        model: Any,
        inputs: list[tuple[str, dict[str, Any]]],
        max_new_tokens: int,
        max_length: int | None,
        batch_size: int,
    ) -> Iterator[Prediction]:
        """Each input's words with their tags (``ortft predict``)."""
        from ortft.families.text import predict

        return predict.tags(model, inputs, max_length, batch_size)

    def encode(self, rows, tokenizer, data, label2id) -> Encoded:
        pairs = [self._words(r, i) for i, r in enumerate(rows)]
        enc = tokenizer(
            [w for w, _ in pairs],
            is_split_into_words=True,
            max_length=data.max_length,
            truncation=True,
            padding="max_length",
        )
        labels = np.full((len(rows), data.max_length), IGNORE_INDEX, dtype=np.int64)
        for i, (_, tags) in enumerate(pairs):
            previous = None
            for pos, word in enumerate(enc.word_ids(i)):
                if word is not None and word != previous:  # the word's first sub-token
                    if tags[word] not in label2id:
                        raise InputError(
                            f"row {i + 1}: tag '{tags[word]}' is not one of "
                            f"data.label_names {list(label2id)}"
                        )
                    labels[i, pos] = label2id[tags[word]]
                previous = word
        return Encoded(
            {
                "input_ids": np.asarray(enc["input_ids"], dtype=np.int64),
                "attention_mask": np.asarray(enc["attention_mask"], dtype=np.int64),
                "labels": labels,
            }
        )

    def metrics(
        self, loss: float, logits: list[np.ndarray], labels: list[np.ndarray]
    ) -> dict[str, Any]:
        preds, golds = [], []
        for lg, lb in zip(logits, labels, strict=False):
            for p_row, g_row in zip(lg.argmax(-1), lb, strict=False):
                keep = g_row != IGNORE_INDEX
                preds.append(p_row[keep])
                golds.append(g_row[keep])
        pred = np.concatenate(preds) if preds else np.zeros(0, dtype=np.int64)
        gold = np.concatenate(golds) if golds else np.zeros(0, dtype=np.int64)
        macro = macro_f1(pred, gold)
        names = self.id2label
        out = {"loss": loss, "accuracy": float(np.mean(pred == gold)) if len(gold) else 0.0}
        if bool(names) and all(n == "O" or n[:2] in ("B-", "I-") for n in names):
            out.update(entity_scores(golds, preds, names))
        else:
            out["f1"] = macro
        out["f1_macro"] = macro
        return out


def entity_scores(
    golds: list[np.ndarray], preds: list[np.ndarray], names: list[str]
) -> dict[str, float]:
    """seqeval's entity precision / recall / F1 (default mode) of per-sentence tag ids."""
    from seqeval.metrics import f1_score, precision_score, recall_score

    y_true = [[names[i] for i in g] for g in golds]
    y_pred = [[names[i] for i in p] for p in preds]
    # zero_division=0: no predicted (or gold) entity scores 0, as seqeval's default, unwarned
    return {
        "precision": float(precision_score(y_true, y_pred, zero_division=0)),
        "recall": float(recall_score(y_true, y_pred, zero_division=0)),
        "f1": float(f1_score(y_true, y_pred, zero_division=0)),
    }


def build(section: Options) -> TokenClassification:
    return TokenClassification(tokens_column=section.tokens_column, tags_column=section.tags_column)
