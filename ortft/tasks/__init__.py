"""Tasks: what a model learns. Each task is one small module exposing a ``Task`` object.

A task knows how to turn raw rows into fixed-length token arrays, which transformers auto
class builds its model, how to score eval predictions, and what its ONNX export looks like.
Adding a task means adding a file here; the training loop never changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import numpy as np

    from ortft.recipe.schema import DataSection


@dataclass
class Encoded:
    """Tokenized examples as fixed-length arrays (the model always sees [batch, max_length])."""

    arrays: dict[str, np.ndarray]  # input_ids, attention_mask, labels (+ task extras)

    def __len__(self) -> int:
        return len(self.arrays["input_ids"])

    def take(self, index: np.ndarray) -> dict[str, np.ndarray]:
        return {k: v[index] for k, v in self.arrays.items()}


class Task(Protocol):
    name: str
    auto_class: str  # transformers auto class that builds the model
    needs_labels: bool  # whether the data must have a label column
    needs_logits: bool  # whether eval metrics need the logits (not just the loss)

    def encode(
        self,
        rows: list[dict[str, Any]],
        tokenizer: Any,
        data: DataSection,
        label2id: dict[str, int] | None,
    ) -> Encoded: ...

    def metrics(
        self, loss: float, logits: list[np.ndarray], labels: list[np.ndarray]
    ) -> dict[str, float]: ...


# Optional members a task may add; the loop reads them with getattr and these defaults:
#   is_decoder = False         call the model with use_cache=False (causal / encoder-decoder models)
#   shift_labels = False       the model predicts labels[:, 1:] (eval counts those positions)
#   export_skip = None         why `ortft train` cannot export this task to ONNX (export is skipped)
#   options_key = ""           the task options that change encode(): part of the tokenize cache key
#   columns(data) -> list      the columns every row must have (default: text [+ pair] [+ label])
#   texts(rows, data) -> list  the texts a tokenizer is trained on (default: the text column)
#   label_names(rows, data)    the label names in id order, for tasks whose labels are not one per row
#   forward(model, input_ids, attention_mask, labels, **extra) -> (loss, logits)
#                              how the model is called (default: the HF model with labels=)
#   collate(batch, epoch, seed) -> batch
#                              per-batch work after slicing (masked-lm's per-epoch masking)
#   generate_metrics(model, tokenizer, encoded) -> dict
#                              eval metrics that need generation, on the plain PyTorch model


def get(name: str, section: Any = None) -> Task:
    """The task called ``name``; ``section`` (the recipe's ``task:``) configures the newer tasks."""
    if name == "sequence-classification":
        from ortft.tasks.classification import TASK
    elif name == "causal-lm":
        from ortft.tasks.causal_lm import TASK
    elif name == "token-classification":
        from ortft.tasks.token_classification import build
    elif name == "masked-lm":
        from ortft.tasks.masked_lm import build
    elif name == "seq2seq":
        from ortft.tasks.seq2seq import build
    elif name == "question-answering":
        from ortft.tasks.question_answering import build
    elif name == "instruction":
        from ortft.tasks.instruction import build
    else:  # the recipe's Literal makes this unreachable from YAML
        raise ValueError(f"unknown task {name}")
    if name in ("sequence-classification", "causal-lm"):
        return TASK
    if section is None:
        from ortft.recipe.schema import TaskSection

        section = TaskSection(name=name)
    return build(section)
