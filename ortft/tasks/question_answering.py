"""question-answering: extractive, SQuAD-style; exact match and F1 over answer spans.

Data: rows with ``question``, ``context``, ``answer_text`` and ``answer_start`` (the answer's
character offset in the context; column names under ``task:``). Question and context are
tokenized as a pair (only the context is truncated); the tokenizer's offsets map the answer's
characters to its first and last token, the labels ``[start, end]``. An answer cut off by
truncation points at the first token ([CLS]), the SQuAD convention for "no answer here".

The model returns start and end logits; ortft stacks them as ``logits`` of shape
[batch, 2, sequence] (also the ONNX output). Metrics: ``exact_match`` (predicted span equals
the gold span) and ``f1`` (token overlap of the two spans), SQuAD's definitions taken over
token positions rather than normalized words.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import Field

from ortft.errors import InputError
from ortft.tasks.base import Encoded, Task, TaskOptions

if TYPE_CHECKING:
    import torch

MAX_ANSWER_TOKENS = 30


class Options(TaskOptions):
    name: Literal["question-answering"] = "question-answering"
    question_column: str = Field(
        "question", description="question-answering: column with the question."
    )
    context_column: str = Field(
        "context", description="question-answering: column with the passage."
    )
    answer_column: str = Field(
        "answer_text", description="question-answering: column with the answer text."
    )
    answer_start_column: str = Field(
        "answer_start",
        description="question-answering: character offset of the answer in the context.",
    )


@dataclass
class QuestionAnswering(Task):
    question_column: str = "question"
    context_column: str = "context"
    answer_column: str = "answer_text"
    answer_start_column: str = "answer_start"
    name = "question-answering"
    auto_class = "AutoModelForQuestionAnswering"
    needs_labels = False
    needs_logits = True
    own_columns = True
    export_kind = "encoder"  # one [2, sequence] row of start/end logits per example
    eval_metrics = ("eval_loss", "eval_exact_match", "eval_f1")
    hf_architectures = ("QuestionAnswering",)

    @property
    def options_key(self) -> str:
        return "|".join(
            [
                self.question_column,
                self.context_column,
                self.answer_column,
                self.answer_start_column,
            ]
        )

    def columns(self, data: Any) -> list[str]:
        return [
            self.question_column,
            self.context_column,
            self.answer_column,
            self.answer_start_column,
        ]

    def texts(self, rows: list[dict[str, Any]], data: Any) -> list[str]:
        return [f"{r[self.question_column]} {r[self.context_column]}" for r in rows]

    def encode(self, rows, tokenizer, data, label2id) -> Encoded:
        questions = [str(r[self.question_column]) for r in rows]
        contexts = [str(r[self.context_column]) for r in rows]
        enc = tokenizer(
            questions,
            contexts,
            max_length=data.max_length,
            truncation="only_second",
            padding="max_length",
            return_offsets_mapping=True,
        )
        labels = np.zeros((len(rows), 2), dtype=np.int64)
        for i, r in enumerate(rows):
            answer, context = str(r[self.answer_column]), contexts[i]
            try:
                start_char = int(r[self.answer_start_column])
            except (TypeError, ValueError):
                raise InputError(
                    f"row {i + 1}: {self.answer_start_column} must be an integer"
                ) from None
            end_char = start_char + len(answer)
            if context[start_char:end_char] != answer:
                raise InputError(
                    f"row {i + 1}: the context at {self.answer_start_column}={start_char} "
                    f"is {context[start_char:end_char]!r}, not the answer {answer!r}"
                )
            seq = enc.sequence_ids(i)
            offsets = enc["offset_mapping"][i]
            tokens = [t for t, s in enumerate(seq) if s == 1]
            start = next((t for t in tokens if offsets[t][0] <= start_char < offsets[t][1]), None)
            end = next(
                (t for t in reversed(tokens) if offsets[t][0] < end_char <= offsets[t][1]), None
            )
            if start is not None and end is not None:  # else truncated away: point at [CLS]
                labels[i] = (start, end)
        return Encoded(
            {
                "input_ids": np.asarray(enc["input_ids"], dtype=np.int64),
                "attention_mask": np.asarray(enc["attention_mask"], dtype=np.int64),
                "labels": labels,
            }
        )

    def forward(
        self,
        model: Any,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        labels: torch.Tensor,
        **extra: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        # -100 (eval's padded rows) becomes the sequence length: transformers ignores that index
        positions = torch.where(labels < 0, torch.full_like(labels, input_ids.shape[1]), labels)
        out = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            start_positions=positions[:, 0],
            end_positions=positions[:, 1],
            return_dict=True,
        )
        return out.loss, torch.stack([out.start_logits, out.end_logits], dim=1)

    def metrics(
        self, loss: float, logits: list[np.ndarray], labels: list[np.ndarray]
    ) -> dict[str, Any]:
        em, f1 = [], []
        for lg, lb in zip(logits, labels, strict=False):
            for (start_logits, end_logits), (gs, ge) in zip(lg, lb, strict=False):
                ps, pe = best_span(start_logits, end_logits)
                em.append(float((ps, pe) == (gs, ge)))
                overlap = max(0, min(pe, ge) - max(ps, gs) + 1)
                f1.append(2 * overlap / ((pe - ps + 1) + (ge - gs + 1)))
        return {
            "loss": loss,
            "exact_match": float(np.mean(em)) if em else 0.0,
            "f1": float(np.mean(f1)) if f1 else 0.0,
        }


def best_span(start_logits: np.ndarray, end_logits: np.ndarray) -> tuple[int, int]:
    """The (start, end) with the highest start + end score, end >= start, at most 30 tokens."""
    n = len(start_logits)
    score = start_logits[:, None] + end_logits[None, :]
    i, j = np.indices((n, n))
    score = np.where((j >= i) & (j - i < MAX_ANSWER_TOKENS), score, -np.inf)
    s, e = np.unravel_index(int(np.argmax(score)), score.shape)
    return int(s), int(e)


def build(section: Options) -> QuestionAnswering:
    return QuestionAnswering(
        section.question_column,
        section.context_column,
        section.answer_column,
        section.answer_start_column,
    )
