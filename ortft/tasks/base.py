"""What every task is: the ``Task`` base class (each member the loop reads, with its default),
the ``TaskOptions`` base of a task's options under the recipe's ``task:``, and ``Encoded`` (what
``encode`` returns; it lives in ``ortft/data/encoded.py`` and is re-exported here).

A task file subclasses both: its options model (``name: Literal["<task>"]`` plus its fields,
``extra="forbid"``) and its task class, then adds one line to the registry
(``ortft.tasks.BUILTIN``, or ``ortft.tasks.register`` from outside ortft).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ortft.core.constants import IGNORE_INDEX
from ortft.core.errors import InputError
from ortft.data import batches
from ortft.data.encoded import Encoded

if TYPE_CHECKING:
    import numpy as np

    from ortft.data.spec import DataSection

__all__ = ["Encoded", "ExportKind", "Task", "TaskOptions", "skip_bad_file"]

# How the ONNX export lays out its logits, and how parity compares them:
#   encoder    one row of logits per example (classification; question answering's [2, seq])
#   per-token  logits per position, compared where attention_mask is 1 (token-cls, masked-lm)
#   decoder    per position, position t predicts t+1; called with use_cache=False (causal LMs)
#   seq2seq    an encoder-decoder: encoder.onnx + decoder.onnx with its KV cache
#   image      pixel_values -> one row of logits per image, plus preprocess.onnx (raw pixels in)
#   speech     encoder.onnx + decoder.onnx (KV cache) on log-mel features, plus features.onnx
#   embedding  a bare encoder: last_hidden_state and the pooled sentence_embedding, each compared
#              (ortft.families.embedding; `ortft export` of a folder without a head gets it too)
#   text-to-image  a Stable Diffusion: text_encoder, unet, vae_decoder and vae_encoder graphs in
#              the layout of ONNX Stable Diffusion pipelines (ortft.families.text_to_image), and
#              draw.py that draws with them
ExportKind = Literal[
    "encoder", "per-token", "decoder", "seq2seq", "image", "speech", "embedding", "text-to-image"
]


def skip_bad_file(data: DataSection, row: int, path: str, err: Exception) -> None:
    """A file task's bad file (``err`` says why) at 1-based ``row``: with
    ``data.on_bad_file=error`` one line naming the row and the file; with ``skip`` a warning,
    and the caller leaves the row out (counted from what its encode kept)."""
    if data.on_bad_file == "error":
        raise InputError(
            f"row {row}: {path}: {err} (data.on_bad_file=skip leaves such files out)"
        ) from None
    logging.getLogger("ortft").warning("skipped %s: %s", path, err)


class TaskOptions(BaseModel):
    """A task's options (the recipe's ``task:``); every task subclasses it."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    name: str = Field(description="What the model learns (the task's registered name).")


class Task:
    """A task: how rows become token arrays, how the model is called and scored, how it exports.

    Subclasses set ``name`` and ``auto_class`` and write ``encode`` and ``metrics``; every other
    member has the default below, so callers read them as plain attributes.
    """

    name: str = ""
    # what a row holds: "text" (a tokenizer makes the arrays), "image" or "audio" (files,
    # decoded per batch by collate; the run loads an image processor, or a speech processor:
    # feature extractor + tokenizer, where text loads a tokenizer)
    modality: str = "text"
    auto_class: str = ""  # transformers auto class that builds the model
    needs_labels = False  # the data has one label per row (data.label_column) or per word
    needs_logits = False  # eval keeps logits only where a metric needs them
    is_decoder = False  # call the model with use_cache=False (causal / encoder-decoder models)
    shift_labels = False  # the model predicts labels[:, 1:] (eval counts those positions)
    # the loss reads no padded position of the encoder's output (the first token, labels -100
    # at padding, or a masked pooling), so backend.unpad may skip them (backends/torch/unpad.py)
    pads_unread = False
    own_columns = False  # rows are read through the task's task.*_column options, not data.*
    export_kind: ExportKind = "encoder"
    # arrays with one value per input position: cut with input_ids when a batch is shortened
    aligned_keys: tuple[str, ...] = ("input_ids", "attention_mask", "token_type_ids", "labels")
    # encode() treats each row on its own, so rows can be tokenized in batches (and processes):
    # False for tasks that look across rows (packing, masking seeded by row number)
    row_local = False
    export_skip: str | None = None  # why `ortft train` cannot export this task (export skipped)
    ondevice = False  # measured with backend.name=ort-ondevice / export --training-artifacts
    eval_metrics: tuple[str, ...] = ("eval_loss",)  # the summary.json names of its eval metrics
    # substrings of a saved model's config.architectures that imply this task; only for a plain
    # Hugging Face model without an ortft recipe (eval / predict / export SOURCE fall back to it)
    hf_architectures: tuple[str, ...] = ()
    # what `ortft predict` gives per input: "label" (with scores), "tags" (one per word),
    # "answer" (a span of the context), "fill-mask" (each [MASK]'s token), "generate" (text),
    # "image-label" (an image file's label, scores and top 5), "transcript" (an audio file's
    # text); None: predict refuses the task
    predicts: str | None = None

    @property
    def main_input(self) -> str:
        """The batch array the model is fed (its rows count the batch): tokens by default; an
        image task's ``pixel_values``, a speech task's features."""
        return "input_ids"

    @property
    def options_key(self) -> str:
        """The task options that change encode(): part of the tokenize cache key."""
        return ""

    def encode(
        self,
        rows: list[dict[str, Any]],
        tokenizer: Any,
        data: DataSection,
        label2id: dict[str, int] | None,
    ) -> Encoded:
        raise NotImplementedError

    def metrics(self, loss: float, logits: list[np.ndarray], labels: list[Any]) -> dict[str, Any]:
        """The eval metrics: ``loss`` (mean over counted labels), and per eval batch its logits
        and what ``metric_labels`` gave for it (default: the labels array)."""
        raise NotImplementedError

    def columns(self, data: DataSection) -> list[str]:
        """The columns every row must have."""
        needed = [data.text_column]
        if data.text_pair_column:
            needed.append(data.text_pair_column)
        if self.needs_labels:
            needed.append(data.label_column)
        return needed

    def read_columns(self, data: DataSection) -> list[str]:
        """The columns encode() reads (what is kept of each row; default: ``columns``)."""
        return self.columns(data)

    def file_column(self, data: DataSection) -> str | None:
        """The column of file paths an image task reads (default: none, rows hold text)."""
        return None

    def texts(self, rows: list[dict[str, Any]], data: DataSection) -> list[str]:
        """The texts a tokenizer is trained on."""
        return [str(row[data.text_column]) for row in rows]

    def label_names(self, rows: list[dict[str, Any]], data: DataSection) -> list[str] | None:
        """The label names in id order (None: the task has no labels)."""
        if not self.needs_labels:
            return None
        from ortft.data.rows import label_names

        return label_names(rows, data)

    def forward(
        self, model: Any, input_ids: Any, attention_mask: Any, labels: Any, **extra: Any
    ) -> tuple[Any, Any]:
        """How the model is called: (loss, logits). Default: the HF model with ``labels=``."""
        kwargs: dict[str, Any] = {"use_cache": False} if self.is_decoder else {}
        out = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            labels=labels,
            return_dict=True,
            **extra,
            **kwargs,
        )
        return out.loss, out.logits

    def counted(self, batch: dict[str, np.ndarray]) -> int:
        """How many positions the model's loss averages over in ``batch``: labels other than
        -100 (from the second on for decoders). A step's micro-batches weigh by it, so the step
        loss is a mean over its real tokens (``num_items_in_batch`` in transformers' Trainer)."""
        labels = batch["labels"]
        counted = labels[:, 1:] if self.shift_labels and labels.ndim > 1 else labels
        return int((counted != IGNORE_INDEX).sum())

    def collate(
        self, batch: dict[str, np.ndarray], epoch: int | None, seed: int
    ) -> dict[str, np.ndarray]:
        """Per-batch work after slicing (``epoch`` None: the fixed eval variant)."""
        return batch

    def cut(self, batch: dict[str, np.ndarray], padding: Any) -> dict[str, np.ndarray]:
        """The batch after ``collate``, its ``aligned_keys`` cut to the length ``padding``
        (``ortft.data.batches.Padding``) gives its longest row (sentence-embedding cuts each
        text's arrays to its own longest)."""
        return batches.cut(batch, padding, self.aligned_keys)
