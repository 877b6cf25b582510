"""causal-lm: next-token prediction; loss and perplexity.

With packing (the default) all texts are joined with the EOS token and cut into blocks of
exactly max_length tokens, so no position is padding. Without packing each text is one
example, padded, and padded positions are masked out of the loss (label -100).
"""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np

from ortft.core.constants import IGNORE_INDEX
from ortft.core.errors import InputError
from ortft.families.generation.starter import STARTER
from ortft.tasks.base import Encoded, Task, TaskOptions


class Options(TaskOptions):
    name: Literal["causal-lm"] = "causal-lm"


class CausalLM(Task):
    name = "causal-lm"
    auto_class = "AutoModelForCausalLM"
    is_decoder = True  # called with use_cache=False: ORTModule cannot flatten a KV cache
    shift_labels = True  # position t predicts labels[t + 1]
    export_kind = "decoder"
    starter = STARTER  # ortft init --task
    predicts = "generate"
    ondevice = True
    pads_unread = True  # backend.unpad applies (unpacked rows: labels -100 at padding)
    eval_metrics = ("eval_loss", "eval_perplexity")
    hf_architectures = ("CausalLM", "LMHead")

    def encode(self, rows, tokenizer, data, label2id) -> Encoded:
        texts = [str(r[data.text_column]) for r in rows if str(r[data.text_column]).strip()]
        L = data.max_length
        if data.packing:
            ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
            eos = tokenizer.eos_token_id
            stream: list[int] = []
            for seq in ids:
                stream.extend(seq)
                if eos is not None:
                    stream.append(eos)
            n = len(stream) // L
            if n == 0:
                raise InputError(
                    f"{len(stream)} tokens of text make no block of data.max_length={L}"
                )
            input_ids = np.asarray(stream[: n * L], dtype=np.int64).reshape(n, L)
            mask = np.ones_like(input_ids)
            labels = input_ids.copy()
        else:
            enc = tokenizer(
                texts, max_length=L, truncation=True, padding="max_length", return_tensors="np"
            )
            input_ids = enc["input_ids"].astype(np.int64)
            mask = enc["attention_mask"].astype(np.int64)
            labels = np.where(mask == 1, input_ids, IGNORE_INDEX)
        return Encoded({"input_ids": input_ids, "attention_mask": mask, "labels": labels})

    def metrics(
        self, loss: float, logits: list[np.ndarray], labels: list[np.ndarray]
    ) -> dict[str, Any]:
        return {"loss": loss, "perplexity": math.exp(min(loss, 50.0))}
