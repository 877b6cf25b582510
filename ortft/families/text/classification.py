"""sequence-classification: one label per text (or text pair); accuracy and macro-F1.

A text pair (``data.text_pair_column``) is tokenized as one sequence, ``[CLS] a [SEP] b [SEP]``
for BERT. Where the model tells the two texts apart by their ``token_type_ids``
(``token_types``), ``encode`` keeps them, the forward feeds them, the ONNX graph takes them and
``ortft predict`` / ``ortft eval`` feed them, so every runtime sees what training saw.
"""

from __future__ import annotations

import inspect
from typing import Any, Literal

import numpy as np

from ortft.core.errors import InputError
from ortft.core.reports import ExportReport
from ortft.families.text.starter import STARTER
from ortft.tasks.base import Encoded, Task, TaskOptions
from ortft.tasks.metrics import macro_f1
from ortft.tasks.protocols import JsCall


class Options(TaskOptions):
    name: Literal["sequence-classification"] = "sequence-classification"


class SequenceClassification(Task):
    name = "sequence-classification"
    starter = STARTER  # ortft init --task
    pads_unread = True  # backend.unpad applies
    auto_class = "AutoModelForSequenceClassification"
    row_local = True  # each row tokenized on its own
    needs_logits = True  # eval keeps logits only where a metric needs them
    needs_labels = True
    ondevice = True
    predicts = "label"
    eval_metrics = ("eval_loss", "eval_accuracy", "eval_f1_macro")
    hf_architectures = ("SequenceClassification",)
    # a pair's token_type_ids reach the model (``token_types``; set by prepare_model)
    segments = True

    def js_call(self, tokenizer: Any, report: ExportReport) -> JsCall | None:
        """transformers.js's ``text-classification`` pipeline on the card's example (model card)."""
        from ortft.export import deploy

        if report.get("text_pair"):  # the card encodes a pair; the pipeline's call is one text
            return None
        return "text-classification", [deploy.EXAMPLE["label"]], {}

    def pair_columns(self, data: Any) -> tuple[str, str] | None:
        return (data.text_column, data.text_pair_column) if data.text_pair_column else None

    def takes_segments(self, model: Any, tokenizer: Any) -> bool:
        return token_types(model, tokenizer)

    def texts(self, rows: list[dict[str, Any]], data: Any) -> list[str]:
        """Both texts of a pair: a tokenizer trained here has to know the second text's words."""
        columns = self.pair_columns(data) or (data.text_column,)
        return [str(row[c]) for row in rows for c in columns]

    def prepare_model(self, model: Any, processor: Any) -> None:
        """Set the config's problem_type to what transformers' first forward would set it to
        (class ids: single-label; one output: regression). That forward writes it into the
        config, and a compiled forward guards on it: on an H200 (torch 2.11) the write cost a
        full recompile at step 2 (gpu-torch-h200-2026-12-04-unpad.json's recompile reasons)."""
        config = model.config
        if getattr(config, "problem_type", None) is None:
            one = config.num_labels == 1
            config.problem_type = "regression" if one else "single_label_classification"
        self.segments = token_types(model, processor)

    def forward(
        self, model: Any, input_ids: Any, attention_mask: Any, labels: Any, **extra: Any
    ) -> tuple[Any, Any]:
        if not self.segments:  # a model without segment embeddings: the pair by [SEP] alone
            extra.pop("token_type_ids", None)
        return super().forward(model, input_ids, attention_mask, labels, **extra)

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
        arrays = {
            "input_ids": enc["input_ids"].astype(np.int64),
            "attention_mask": enc["attention_mask"].astype(np.int64),
            "labels": labels,
        }
        if pairs is not None and "token_type_ids" in enc:  # which text each token is from
            arrays["token_type_ids"] = enc["token_type_ids"].astype(np.int64)
        return Encoded(arrays)

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


def token_types(model: Any, tokenizer: Any) -> bool:
    """Whether a text pair's ``token_type_ids`` go to ``model``: its tokenizer makes them
    (``model_input_names``), its forward takes them and it has an embedding per text
    (``type_vocab_size`` >= 2). A pretrained RoBERTa (one row) and GPT-2 (which would look the
    ids up in its word embeddings) tell the texts apart by the separator alone."""
    names = getattr(tokenizer, "model_input_names", ())
    forward = inspect.signature(model.forward).parameters
    types = getattr(model.config, "type_vocab_size", 0) or 0
    return "token_type_ids" in names and "token_type_ids" in forward and types >= 2


def build(options: Options) -> SequenceClassification:
    return SequenceClassification()
