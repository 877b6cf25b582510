"""seq2seq: encoder-decoder text-to-text (translation, summarization); loss, perplexity, and
exact match / token F1 of generated outputs.

Data: rows with a ``source`` and a ``target`` text (column names under ``task:``). Sources are
padded to ``data.max_length``, targets to ``task.max_target_length``; padded target positions
get -100. The model builds its decoder inputs from the labels itself (T5 and BART shift them
right), so a batch is just input_ids, attention_mask and labels.

Eval: the loss over every eval row, then ``model.generate`` (greedy, plain PyTorch: generation
runs outside ORTModule) on the first ``task.generate_samples`` rows. ``exact_match`` and
``token_f1`` are SQuAD v1.1's exact match and word-overlap F1 (``ortft.tasks.squad``: lowercase,
no punctuation, no articles a/an/the, collapsed whitespace) of the decoded output against the
decoded target. ``ortft eval`` reports the same on a saved model; ``ortft predict`` generates.

ONNX: exported as two graphs, ``encoder_model.onnx`` and ``decoder_model_merged.onnx`` with both caches
(``ortft.families.generation.seq2seq_graphs``); ``ortft eval`` / ``predict`` run them as they
run PyTorch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field

from ortft.core.constants import IGNORE_INDEX
from ortft.tasks import squad
from ortft.tasks.base import Encoded, Task, TaskOptions


class Options(TaskOptions):
    name: Literal["seq2seq"] = "seq2seq"
    source_column: str = Field("source", description="seq2seq: column with the input text.")
    target_column: str = Field("target", description="seq2seq: column with the output text.")
    max_target_length: Annotated[int, Field(ge=4, le=4096)] = Field(
        64, description="seq2seq: target tokens per example (padded/truncated to this)."
    )
    generate_samples: Annotated[int, Field(ge=0)] = Field(
        8,
        description="seq2seq: eval rows decoded with generate() for exact match / token F1 (0: none).",
    )


@dataclass
class Seq2Seq(Task):
    source_column: str = "source"
    target_column: str = "target"
    max_target_length: int = 64
    generate_samples: int = 8
    name = "seq2seq"
    auto_class = "AutoModelForSeq2SeqLM"
    row_local = True  # each row tokenized on its own
    is_decoder = True  # use_cache=False: no past_key_values through ORTModule
    own_columns = True
    export_kind = "seq2seq"
    predicts = "generate"  # greedy from the input as source (PyTorch or the ONNX pair)
    eval_metrics = ("eval_loss", "eval_perplexity", "eval_exact_match", "eval_token_f1")
    aligned_keys = ("input_ids", "attention_mask")  # labels are the target: their own length

    @property
    def options_key(self) -> str:
        return f"{self.source_column}|{self.target_column}|{self.max_target_length}"

    def columns(self, data: Any) -> list[str]:
        return [self.source_column, self.target_column]

    def texts(self, rows: list[dict[str, Any]], data: Any) -> list[str]:
        return [str(r[c]) for r in rows for c in (self.source_column, self.target_column)]

    def encode(self, rows, tokenizer, data, label2id) -> Encoded:
        src = tokenizer(
            [str(r[self.source_column]) for r in rows],
            max_length=data.max_length,
            truncation=True,
            padding="max_length",
            return_tensors="np",
        )
        tgt = tokenizer(
            [str(r[self.target_column]) for r in rows],
            max_length=self.max_target_length,
            truncation=True,
            padding="max_length",
            return_tensors="np",
        )
        labels = np.where(tgt["attention_mask"] == 1, tgt["input_ids"], IGNORE_INDEX).astype(
            np.int64
        )
        return Encoded(
            {
                "input_ids": src["input_ids"].astype(np.int64),
                "attention_mask": src["attention_mask"].astype(np.int64),
                "labels": labels,
            }
        )

    def metrics(
        self, loss: float, logits: list[np.ndarray], labels: list[np.ndarray]
    ) -> dict[str, Any]:
        return {"loss": loss, "perplexity": math.exp(min(loss, 50.0))}

    def generate(
        self, model: Any, input_ids: np.ndarray, attention_mask: np.ndarray, max_new_tokens: int
    ) -> np.ndarray:
        """Greedy ``model.generate`` on the plain PyTorch model (or the ONNX export's own
        greedy loop, ``seq2seq_graphs.OnnxSeq2Seq``): the output token ids."""
        import torch

        if not isinstance(model, torch.nn.Module):  # the ONNX encoder + decoder
            return model.generate(input_ids, attention_mask, max_new_tokens)[0]

        hf: Any = model  # a transformers model: generate() is its own
        device = next(hf.parameters()).device
        was_training = hf.training
        hf.eval()
        with torch.no_grad():
            out = hf.generate(
                input_ids=torch.from_numpy(input_ids).to(device),
                attention_mask=torch.from_numpy(attention_mask).to(device),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                num_beams=1,
            )
        model.train(was_training)
        return out.cpu().numpy()

    def generate_metrics(self, model: Any, tokenizer: Any, encoded: Encoded) -> dict[str, float]:
        n = min(self.generate_samples, len(encoded))
        if n == 0:
            return {}
        rows = encoded.take(np.arange(n))
        out = self.generate(
            model, rows["input_ids"], rows["attention_mask"], self.max_target_length
        )
        preds = tokenizer.batch_decode(out, skip_special_tokens=True)
        golds = tokenizer.batch_decode(
            [[t for t in row if t != IGNORE_INDEX] for row in rows["labels"]],
            skip_special_tokens=True,
        )
        pairs = list(zip(preds, golds, strict=True))
        return {
            "exact_match": float(np.mean([squad.exact_match(p, g) for p, g in pairs])),
            "token_f1": float(np.mean([squad.f1(p, g) for p, g in pairs])),
        }


def token_f1(pred: str, gold: str) -> float:
    """SQuAD v1.1's word-overlap F1 (kept under this name: ``eval_token_f1``)."""
    return squad.f1(pred, gold)
