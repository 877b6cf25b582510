"""sequence-classification: one label per text (or text pair); accuracy and macro-F1."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

from ortft.core.errors import InputError
from ortft.tasks.base import Encoded, Task, TaskOptions


class Options(TaskOptions):
    name: Literal["sequence-classification"] = "sequence-classification"


class SequenceClassification(Task):
    name = "sequence-classification"
    pads_unread = True  # backend.unpad applies
    auto_class = "AutoModelForSequenceClassification"
    row_local = True  # each row tokenized on its own
    needs_logits = True  # eval keeps logits only where a metric needs them
    needs_labels = True
    ondevice = True
    predicts = "label"
    eval_metrics = ("eval_loss", "eval_accuracy", "eval_f1_macro")
    hf_architectures = ("SequenceClassification",)

    def prepare_model(self, model: Any, processor: Any) -> None:
        """Set the config's problem_type to what transformers' first forward would set it to
        (class ids: single-label; one output: regression). That forward writes it into the
        config, and a compiled forward guards on it: on an H200 (torch 2.11) the write cost a
        full recompile at step 2 (gpu-torch-h200-2026-12-04-unpad.json's recompile reasons)."""
        config = model.config
        if getattr(config, "problem_type", None) is None:
            one = config.num_labels == 1
            config.problem_type = "regression" if one else "single_label_classification"

    def encode(self, rows, tokenizer, data, label2id) -> Encoded:
        texts = [str(r[data.text_column]) for r in rows]
        pairs = [str(r[data.text_pair_column]) for r in rows] if data.text_pair_column else None
        enc = tokenizer(
            texts,
            pairs,
            max_length=data.max_length,
            truncation=True,
            padding="max_length",
            return_tensors="np",
        )
        labels = np.empty(len(rows), dtype=np.int64)
        for i, r in enumerate(rows):
            key = str(r[data.label_column])
            if key not in label2id:
                raise InputError(
                    f"row {i + 1}: label '{key}' is not one of data.label_names {list(label2id)}"
                )
            labels[i] = label2id[key]
        return Encoded(
            {
                "input_ids": enc["input_ids"].astype(np.int64),
                "attention_mask": enc["attention_mask"].astype(np.int64),
                "labels": labels,
            }
        )

    def metrics(
        self, loss: float, logits: list[np.ndarray], labels: list[np.ndarray]
    ) -> dict[str, Any]:
        pred = np.concatenate([lg.argmax(-1) for lg in logits])
        gold = np.concatenate(labels)
        return {
            "loss": loss,
            "accuracy": float(np.mean(pred == gold)) if len(gold) else 0.0,
            "f1_macro": macro_f1(pred, gold),
        }


def macro_f1(pred: np.ndarray, gold: np.ndarray) -> float:
    """Unweighted mean of per-class F1 over the classes seen in either array."""
    f1s = []
    for c in np.union1d(pred, gold):
        tp = np.sum((pred == c) & (gold == c))
        fp = np.sum((pred == c) & (gold != c))
        fn = np.sum((pred != c) & (gold == c))
        f1s.append(2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0)
    return float(np.mean(f1s)) if f1s else 0.0


def build(options: Options) -> SequenceClassification:
    return SequenceClassification()
