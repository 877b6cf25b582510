"""Tokenized examples as arrays (``Encoded``), and what data asks of the thing that makes them
(``Encoder``: a task, structurally; data never imports ``ortft.tasks``).

``Encoded`` is an extension point: a task's ``encode`` returns one (``ortft.tasks.Encoded`` is
this class).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import numpy as np

    from ortft.data.spec import DataSection


@dataclass
class Encoded:
    """Tokenized examples as fixed-length arrays (the model always sees [batch, max_length])."""

    arrays: dict[str, np.ndarray]  # input_ids, attention_mask, labels (+ task extras)

    def __len__(self) -> int:
        # every task has labels (a causal LM's are its ids); image rows have no input_ids
        return len(self.arrays["labels"])

    def take(self, index: np.ndarray) -> dict[str, np.ndarray]:
        return {k: v[index] for k, v in self.arrays.items()}

    def column(self, name: str) -> np.ndarray:
        """One array, every row."""
        return self.arrays[name]


class Encoder(Protocol):
    """Something that encodes rows: what the tokenized cache and streams call on a task
    (``ortft.tasks.Task`` is one). An ``options_key`` (str), when it has one, is part of the
    tokenized cache key."""

    @property
    def name(self) -> str:
        """Part of the tokenized cache key, and recorded in each cache entry."""
        ...

    def encode(
        self,
        rows: list[dict[str, Any]],
        tokenizer: Any,
        data: DataSection,
        label2id: dict[str, int] | None,
    ) -> Encoded:
        """Rows -> their arrays."""
        ...


@runtime_checkable
class RowLocal(Protocol):
    """A task whose ``encode`` treats each row on its own (classification, tagging, seq2seq,
    sentence embedding, the file tasks): rows may be tokenized in batches, and in processes."""

    @property
    def row_local(self) -> bool: ...


def row_local(task: object) -> bool:
    """Whether ``task``'s rows may be encoded apart (``RowLocal``); False: every row in one
    call, for a task that looks across rows (packing, masking seeded by row number)."""
    return isinstance(task, RowLocal) and task.row_local
