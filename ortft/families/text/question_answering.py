"""question-answering: extractive, SQuAD-style; SQuAD v1.1 exact match and F1 over answer text.

Data: rows with ``question``, ``context``, ``answer_text`` and ``answer_start`` (the answer's
character offset in the context; column names under ``task:``). Question and context are
tokenized as a pair (only the context is truncated; one window per example, no doc stride);
the tokenizer's offsets map the answer's characters to its first and last token, the labels
``[start, end]``. An answer cut off by truncation points at the first token ([CLS]), the SQuAD
convention for "no answer here".

The model returns start and end logits; ortft stacks them as ``logits`` of shape
[batch, 2, sequence] for the loss, parity and eval. The ONNX graph gives them apart, as
``start_logits`` and ``end_logits`` (each [batch, sequence]: what Optimum's exports give and
transformers.js's question-answering pipeline reads); an export of format 2 gave the stacked
``logits``, which ortft still reads (``ortft.export.parity.graph_logits``). The predicted span
is the best start + end score over context tokens (end >= start, at most 30 tokens), read back
as the context's characters.
Metrics: ``exact_match`` and ``f1`` of that text against the answer text, with the official
SQuAD v1.1 normalization (``ortft/tasks/squad.py``); an answer truncated away is a miss. To score
text, each encoded row carries the context part its window covers (``_window``, UTF-8), each
token's byte span in it (``_spans``) and the answer (``_answer``); the model never sees them.
Their size is of the order of the token ids' own: a 384-token window covers ~2 KB of text and
its spans take 3 KB (int32), next to 3 KB of int64 input_ids.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import Field

from ortft.core.errors import InputError
from ortft.core.reports import ExportReport
from ortft.families.text.spans import OUTPUTS, best_span, context_char_spans, span_logits
from ortft.tasks import squad
from ortft.tasks.base import Encoded, Task, TaskOptions
from ortft.tasks.protocols import JsCall

if TYPE_CHECKING:
    import torch

    from ortft.core.reports import Prediction


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
    needs_logits = True
    own_columns = True
    export_kind = "encoder"  # one [2, sequence] row of start/end logits per example
    output_names = OUTPUTS  # the export's two outputs (protocols.ReadsOutput)
    predicts = "answer"
    eval_metrics = ("eval_loss", "eval_exact_match", "eval_f1")
    hf_architectures = ("QuestionAnswering",)

    def js_call(self, tokenizer: Any, report: ExportReport) -> JsCall | None:
        """transformers.js's ``question-answering`` pipeline on the card's example (model card)."""
        from ortft.export import deploy

        return "question-answering", list(deploy.QA_EXAMPLE), {}

    @property
    def options_key(self) -> str:
        return "|".join(
            [
                "text-v2",  # the encoding: rows carry their text (a cache from before has not)
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

    def tokenize(self, questions: list[str], contexts: list[str], tokenizer: Any, length: int):
        """Question/context pairs as ``length`` tokens (only the context truncated), with offsets."""
        return tokenizer(
            questions,
            contexts,
            max_length=length,
            truncation="only_second",
            padding="max_length",
            return_offsets_mapping=True,
        )

    def encode(self, rows, tokenizer, data, label2id) -> Encoded:
        questions = [str(r[self.question_column]) for r in rows]
        contexts = [str(r[self.context_column]) for r in rows]
        enc = self.tokenize(questions, contexts, tokenizer, data.max_length)
        labels = np.zeros((len(rows), 2), dtype=np.int64)
        windows, spans, answers = [], [], []
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
            chars = context_char_spans(enc, i)
            tokens = np.flatnonzero(chars[:, 0] >= 0)
            start = next((t for t in tokens if chars[t, 0] <= start_char < chars[t, 1]), None)
            end = next((t for t in reversed(tokens) if chars[t, 0] < end_char <= chars[t, 1]), None)
            if start is not None and end is not None:  # else truncated away: point at [CLS]
                labels[i] = (start, end)
            window, byte_spans = _window(context, chars)
            windows.append(window)
            spans.append(byte_spans)
            answers.append(answer.encode("utf-8"))
        return Encoded(
            {
                "input_ids": np.asarray(enc["input_ids"], dtype=np.int64),
                "attention_mask": np.asarray(enc["attention_mask"], dtype=np.int64),
                "labels": labels,
                "_window": _padded_bytes(windows),
                "_spans": np.stack(spans).astype(np.int32),
                "_answer": _padded_bytes(answers),
            }
        )

    # _spans holds one byte span per input position: cut with input_ids (data.padding)
    aligned_keys = ("input_ids", "attention_mask", "token_type_ids", "_spans")

    def metric_labels(self, batch: dict[str, np.ndarray], valid: int) -> dict[str, np.ndarray]:
        return {k: batch[k][:valid] for k in ("labels", "_window", "_spans", "_answer")}

    def forward(
        self,
        model: Any,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        labels: torch.Tensor,
        **extra: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        out = model(input_ids=input_ids, attention_mask=attention_mask, return_dict=True)
        logits = span_logits(out)
        # padding is never an answer: masked out of the softmax, so the loss does not depend on
        # how much of it a batch carries (data.padding), as transformers' own QA loss would
        logits = logits.masked_fill(attention_mask[:, None, :] == 0, torch.finfo(logits.dtype).min)
        # -100 (eval's padded rows) becomes the sequence length, which the loss ignores
        seq = input_ids.shape[1]
        positions = torch.where(labels < 0, torch.full_like(labels, seq), labels).clamp(0, seq)
        ce = torch.nn.CrossEntropyLoss(ignore_index=seq)
        loss = (ce(logits[:, 0], positions[:, 0]) + ce(logits[:, 1], positions[:, 1])) / 2
        return loss, logits

    def output_logits(self, out: Any) -> Any:
        return span_logits(out)

    def example_input(self) -> dict[str, str]:
        from ortft.export.deploy import QA_EXAMPLE

        return dict(zip((self.question_column, self.context_column), QA_EXAMPLE, strict=True))

    def predict_lines(
        self,
        model: Any,
        inputs: list[tuple[str, dict[str, Any]]],
        max_new_tokens: int,
        max_length: int | None,
        batch_size: int,
    ) -> Iterator[Prediction]:
        """Each question's answer, read from its context (``ortft predict``)."""
        from ortft.families.text import predict

        return predict.answers(model, inputs, max_length, batch_size)

    def eval_logits(self, logits: np.ndarray, batch: dict[str, np.ndarray]) -> np.ndarray:
        """A saved model's raw start/end logits, masked as training's (``forward``)."""
        pad = batch["attention_mask"][:, None, :] == 0
        return np.where(pad, np.finfo(np.float32).min, logits).astype(np.float32)

    def metrics(
        self, loss: float, logits: list[np.ndarray], labels: list[dict[str, np.ndarray]]
    ) -> dict[str, Any]:
        em, f1 = [], []
        for lg, lb in zip(logits, labels, strict=True):
            for row, (start_logits, end_logits) in enumerate(lg):
                spans = lb["_spans"][row]
                best = best_span(start_logits, end_logits, spans[:, 0] >= 0)
                window = bytes(lb["_window"][row])
                pred = (
                    window[spans[best[0], 0] : spans[best[1], 1]].decode("utf-8")
                    if best is not None
                    else ""
                )
                gold = bytes(lb["_answer"][row]).rstrip(b"\0").decode("utf-8")
                em.append(squad.exact_match(pred, gold))
                f1.append(squad.f1(pred, gold))
        return {
            "loss": loss,
            "exact_match": float(np.mean(em)) if em else 0.0,
            "f1": float(np.mean(f1)) if f1 else 0.0,
        }


def _window(context: str, chars: np.ndarray) -> tuple[bytes, np.ndarray]:
    """The context part the window's tokens cover (UTF-8), and each token's byte span in it."""
    spans = np.full(chars.shape, -1, dtype=np.int64)
    inside = chars[:, 0] >= 0
    if not inside.any():
        return b"", spans
    first, last = int(chars[inside, 0].min()), int(chars[inside, 1].max())
    text = context[first:last]
    at = np.cumsum([0] + [len(ch.encode("utf-8")) for ch in text])  # char -> byte offset
    spans[inside] = at[chars[inside] - first]
    return text.encode("utf-8"), spans


def _padded_bytes(items: list[bytes]) -> np.ndarray:
    """Byte strings as one uint8 array, NUL-padded to the longest (np.savez needs no pickle)."""
    out = np.zeros((len(items), max((len(b) for b in items), default=0)), dtype=np.uint8)
    for i, b in enumerate(items):
        out[i, : len(b)] = np.frombuffer(b, dtype=np.uint8)
    return out


def build(section: Options) -> QuestionAnswering:
    return QuestionAnswering(
        section.question_column,
        section.context_column,
        section.answer_column,
        section.answer_start_column,
    )
