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

    from ortft.recipe import DataSection


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

    def encode(self, rows: list[dict[str, Any]], tokenizer: Any, data: DataSection,
               label2id: dict[str, int] | None) -> Encoded: ...

    def metrics(self, loss: float, logits: list[np.ndarray], labels: list[np.ndarray]) -> dict[str, float]: ...


def get(name: str) -> Task:
    if name == "sequence-classification":
        from ortft.tasks.classification import TASK
    elif name == "causal-lm":
        from ortft.tasks.causal_lm import TASK
    else:  # the recipe's Literal makes this unreachable from YAML
        raise ValueError(f"unknown task {name}")
    return TASK
