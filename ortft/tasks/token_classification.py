"""token-classification: one tag per word (NER, POS); token accuracy, entity F1 and macro-F1.

Data: rows with a list of words (``task.tokens_column``, default ``tokens``) and one tag per
word (``task.tags_column``, default ``tags``). Words are tokenized with
``is_split_into_words``; the first sub-token of each word carries the word's tag, the other
sub-tokens and the special tokens get -100, so the loss and the metrics count each word once.

Metrics: ``accuracy`` over labelled words; ``f1`` is entity-level (exact spans, seqeval-style)
when the tags are BIO/IOB2 (``B-X`` / ``I-X`` / ``O``), else the macro-F1 over tags;
``f1_macro`` is always the macro-F1 over tags.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from pydantic import Field

from ortft.errors import InputError
from ortft.tasks.base import Encoded, Task, TaskOptions
from ortft.tasks.classification import macro_f1

IGNORE = -100


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
    auto_class = "AutoModelForTokenClassification"
    needs_labels = True
    needs_logits = True
    own_columns = True
    export_kind = "per-token"
    eval_metrics = ("eval_loss", "eval_accuracy", "eval_f1", "eval_f1_macro")
    hf_architectures = ("TokenClassification",)

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
        self.id2label = names
        return names

    def encode(self, rows, tokenizer, data, label2id) -> Encoded:
        pairs = [self._words(r, i) for i, r in enumerate(rows)]
        enc = tokenizer(
            [w for w, _ in pairs],
            is_split_into_words=True,
            max_length=data.max_length,
            truncation=True,
            padding="max_length",
        )
        labels = np.full((len(rows), data.max_length), IGNORE, dtype=np.int64)
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
                keep = g_row != IGNORE
                preds.append(p_row[keep])
                golds.append(g_row[keep])
        pred = np.concatenate(preds) if preds else np.zeros(0, dtype=np.int64)
        gold = np.concatenate(golds) if golds else np.zeros(0, dtype=np.int64)
        macro = macro_f1(pred, gold)
        names = self.id2label
        bio = bool(names) and all(n == "O" or n[:2] in ("B-", "I-") for n in names)
        return {
            "loss": loss,
            "accuracy": float(np.mean(pred == gold)) if len(gold) else 0.0,
            "f1": _entity_f1(preds, golds, names) if bio else macro,
            "f1_macro": macro,
        }


def spans(tags: list[str]) -> set[tuple[int, int, str]]:
    """Entity spans (start, end, type) of a BIO tag sequence; a stray I-X starts an entity."""
    out, start, kind = set(), None, None
    for i, tag in enumerate([*tags, "O"]):
        inside = tag.startswith("I-") and kind == tag[2:]
        if start is not None and not inside:
            out.add((start, i, kind))
            start, kind = None, None
        if tag.startswith("B-") or (tag.startswith("I-") and not inside):
            start, kind = i, tag[2:]
    return out


def _entity_f1(preds: list[np.ndarray], golds: list[np.ndarray], names: list[str]) -> float:
    tp = n_pred = n_gold = 0
    for p, g in zip(preds, golds, strict=False):
        ps, gs = spans([names[i] for i in p]), spans([names[i] for i in g])
        tp, n_pred, n_gold = tp + len(ps & gs), n_pred + len(ps), n_gold + len(gs)
    return 2 * tp / (n_pred + n_gold) if n_pred + n_gold else 0.0


def build(section: Options) -> TokenClassification:
    return TokenClassification(tokens_column=section.tokens_column, tags_column=section.tags_column)
