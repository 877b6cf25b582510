"""What every task is: the ``Task`` base class (each member the loop reads, with its default),
the ``TaskOptions`` base of a task's options under the recipe's ``task:``, and ``Encoded`` (what
``encode`` returns; it lives in ``ortft/data/encoded.py`` and is re-exported here).

A task file subclasses both: its options model (``name: Literal["<task>"]`` plus its fields,
``extra="forbid"``) and its task class, then adds one line to the registry
(``ortft.tasks.BUILTIN``, or ``ortft.tasks.register`` from outside ortft).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from ortft.core.constants import IGNORE_INDEX
from ortft.core.errors import InputError
from ortft.data import batches
from ortft.data.encoded import Encoded
from ortft.tasks.traits import ExportKind, decodes, shifts_labels

if TYPE_CHECKING:
    import numpy as np

    from ortft.data.spec import DataSection

__all__ = ["Encoded", "ExportKind", "Task", "TaskOptions", "skip_bad_file"]


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
    """A task: how rows become arrays, how the model is called and scored, how a batch is cut.

    What every task has, and nothing more: subclasses set ``name`` and ``auto_class`` and write
    ``encode`` and ``metrics``; the other members have the defaults below. What only some tasks
    need (labels, their own columns, a decoder's shifted labels, an export kind, what predict
    gives, ...) is a small protocol they implement (``ortft.tasks.traits``,
    ``ortft.tasks.protocols``, and what data reads in ``ortft.data.checks``, ``.rows``,
    ``.encoded`` and ``.batches``), read through a function beside it that gives the default
    for a task without it.
    """

    name: str = ""
    # what a row holds: "text" (a tokenizer makes the arrays), "image" or "audio" (files,
    # decoded per batch by collate; the run loads an image processor, or a speech processor:
    # feature extractor + tokenizer, where text loads a tokenizer)
    modality: str = "text"
    auto_class: str = ""  # transformers auto class that builds the model
    eval_metrics: tuple[str, ...] = ("eval_loss",)  # the summary.json names of its eval metrics

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

    def forward(
        self, model: Any, input_ids: Any, attention_mask: Any, labels: Any, **extra: Any
    ) -> tuple[Any, Any]:
        """How the model is called: (loss, logits). Default: the HF model with ``labels=``
        (and ``use_cache=False`` for a decoder, ``protocols.Decodes``)."""
        kwargs: dict[str, Any] = {"use_cache": False} if decodes(self) else {}
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
        -100 (from the second on where the labels shift, ``protocols.ShiftsLabels``). A step's
        micro-batches weigh by it, so the step loss is a mean over its real tokens
        (``num_items_in_batch`` in transformers' Trainer)."""
        labels = batch["labels"]
        counted = labels[:, 1:] if shifts_labels(self) and labels.ndim > 1 else labels
        return int((counted != IGNORE_INDEX).sum())

    def collate(
        self, batch: dict[str, np.ndarray], epoch: int | None, seed: int
    ) -> dict[str, np.ndarray]:
        """Per-batch work after slicing (``epoch`` None: the fixed eval variant)."""
        return batch

    def cut(self, batch: dict[str, np.ndarray], padding: Any) -> dict[str, np.ndarray]:
        """The batch after ``collate``, its aligned arrays (``batches.aligned_keys``) cut to the
        length ``padding`` (``ortft.data.batches.Padding``) gives its longest row
        (sentence-embedding cuts each text's arrays to its own longest)."""
        return batches.cut(batch, padding, batches.aligned_keys(self))
