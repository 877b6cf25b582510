"""instruction: chat / instruction tuning of a causal LM; loss and perplexity over responses.

Data: rows with ``prompt`` and ``response`` columns, or a ``messages`` column holding a chat
(``[{"role": "user" | "assistant" | "system", "content": ...}, ...]``); names under ``task:``.

Formatting: the tokenizer's chat template when it has one (``task.template: auto``), else
this simple template, also what ``task.template: simple`` always uses::

    ### Instruction:
    {prompt}

    ### Response:
    {response}<eos>

(a chat in the simple template: one "### User:" / "### Assistant:" / "### System:" block per
message, each assistant block ending with EOS). Only response (assistant) tokens are learned:
every other token, prompt and template text, gets label -100.

Packing (``data.packing``, the default): whole examples are placed one after another into
blocks of ``data.max_length`` tokens (first fit, in data order); no example is split across
blocks, the rest of a block is padding (label -100). Examples in one block can attend to the
earlier ones in it, as in most packing implementations. An example longer than a block is
truncated to it. Without packing each example is its own padded row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from pydantic import Field

from ortft.core.constants import IGNORE_INDEX
from ortft.core.errors import InputError
from ortft.tasks.base import Encoded, Task, TaskOptions

SIMPLE_ROLES = {"user": "User", "assistant": "Assistant", "system": "System"}


class Options(TaskOptions):
    name: Literal["instruction"] = "instruction"
    prompt_column: str = Field("prompt", description="instruction: column with the prompt.")
    response_column: str = Field("response", description="instruction: column with the response.")
    messages_column: str = Field(
        "messages",
        description="instruction: column with a chat ([{role, content}, ...]); used when present.",
    )
    template: Literal["auto", "simple"] = Field(
        "auto",
        description="instruction: auto uses the tokenizer's chat template when it has one, else "
        "the simple '### Instruction / ### Response' template; simple always uses the latter.",
    )


@dataclass
class Instruction(Task):
    prompt_column: str = "prompt"
    response_column: str = "response"
    messages_column: str = "messages"
    template: str = "auto"
    name = "instruction"
    auto_class = "AutoModelForCausalLM"
    is_decoder = True
    shift_labels = True
    own_columns = True
    export_kind = "decoder"
    predicts = "generate"  # the input as a prompt, formatted as in training
    pads_unread = True  # backend.unpad applies: a block's padding has label -100
    eval_metrics = ("eval_loss", "eval_perplexity")

    @property
    def options_key(self) -> str:
        return f"{self.prompt_column}|{self.response_column}|{self.messages_column}|{self.template}"

    def columns(self, data: Any) -> list[str]:
        return []  # either prompt/response or messages: checked per row in _segments

    def read_columns(self, data: Any) -> list[str]:
        return [self.prompt_column, self.response_column, self.messages_column]

    def texts(self, rows: list[dict[str, Any]], data: Any) -> list[str]:
        return ["".join(text for text, _ in self._segments(r, i, None)) for i, r in enumerate(rows)]

    def prompt(self, text: str, tokenizer: Any) -> str:
        """``ortft predict``: the text as a user turn, formatted as in training, up to where the
        response starts."""
        msgs = [{"role": "user", "content": text}]
        if self.template == "auto" and getattr(tokenizer, "chat_template", None):
            return tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        return f"### Instruction:\n{text}\n\n### Response:\n"

    def _messages(self, row: dict[str, Any], i: int) -> list[dict[str, str]]:
        if self.messages_column in row and row[self.messages_column]:
            msgs = row[self.messages_column]
            if not isinstance(msgs, list) or not all(
                isinstance(m, dict) and "role" in m and "content" in m for m in msgs
            ):
                raise InputError(
                    f"row {i + 1}: {self.messages_column} must be a list of "
                    "{role, content} objects"
                )
            return [{"role": str(m["role"]), "content": str(m["content"])} for m in msgs]
        if self.prompt_column in row and self.response_column in row:
            return [
                {"role": "user", "content": str(row[self.prompt_column])},
                {"role": "assistant", "content": str(row[self.response_column])},
            ]
        raise InputError(
            f"row {i + 1}: needs {self.prompt_column} and {self.response_column}, or "
            f"{self.messages_column} (has: {', '.join(sorted(map(str, row)))})"
        )

    def _segments(self, row: dict[str, Any], i: int, tokenizer: Any) -> list[tuple[str, bool]]:
        """The example as (text, learned?) pieces, in order."""
        msgs = self._messages(row, i)
        eos = (tokenizer.eos_token or "") if tokenizer is not None else ""
        if (
            tokenizer is not None
            and self.template == "auto"
            and getattr(tokenizer, "chat_template", None)
        ):
            return _template_segments(tokenizer, msgs)
        if len(msgs) == 2 and [m["role"] for m in msgs] == ["user", "assistant"]:
            return [
                (f"### Instruction:\n{msgs[0]['content']}\n\n### Response:\n", False),
                (msgs[1]["content"] + eos, True),
            ]
        out: list[tuple[str, bool]] = []
        for m in msgs:
            role = SIMPLE_ROLES.get(m["role"], m["role"].title())
            out.append((f"### {role}:\n", False))
            learned = m["role"] == "assistant"
            out.append((m["content"] + (eos if learned else "") + "\n\n", learned))
        return out

    def _example(
        self, row: dict[str, Any], i: int, tokenizer: Any, limit: int
    ) -> tuple[list[int], list[int]]:
        ids: list[int] = []
        labels: list[int] = []
        for text, learned in self._segments(row, i, tokenizer):
            piece = tokenizer(text, add_special_tokens=False)["input_ids"]
            ids.extend(piece)
            labels.extend(piece if learned else [IGNORE_INDEX] * len(piece))
        return ids[:limit], labels[:limit]

    def encode(self, rows, tokenizer, data, label2id) -> Encoded:
        L = data.max_length
        examples = [self._example(r, i, tokenizer, L) for i, r in enumerate(rows)]
        # nothing to learn: drop
        examples = [e for e in examples if any(t != IGNORE_INDEX for t in e[1])]
        if not examples:
            raise InputError("no example has a response token within data.max_length")
        blocks: list[tuple[list[int], list[int]]] = []
        if data.packing:
            for ids, labels in examples:  # first fit: the first block with room takes the example
                for block in blocks:
                    if len(block[0]) + len(ids) <= L:
                        block[0].extend(ids)
                        block[1].extend(labels)
                        break
                else:
                    blocks.append((list(ids), list(labels)))
        else:
            blocks = examples
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        input_ids = np.full((len(blocks), L), pad, dtype=np.int64)
        mask = np.zeros((len(blocks), L), dtype=np.int64)
        labels_arr = np.full((len(blocks), L), IGNORE_INDEX, dtype=np.int64)
        for b, (ids, labels) in enumerate(blocks):
            input_ids[b, : len(ids)], mask[b, : len(ids)], labels_arr[b, : len(ids)] = (
                ids,
                1,
                labels,
            )
        return Encoded({"input_ids": input_ids, "attention_mask": mask, "labels": labels_arr})

    def metrics(
        self, loss: float, logits: list[np.ndarray], labels: list[np.ndarray]
    ) -> dict[str, Any]:
        return {"loss": loss, "perplexity": math.exp(min(loss, 50.0))}


def _template_segments(tokenizer: Any, msgs: list[dict[str, str]]) -> list[tuple[str, bool]]:
    """Split the chat template's rendering into pieces: each assistant message's text is learned.

    Rendering the chat up to each message, with and without the generation prompt, gives the
    text the template adds before an assistant turn (not learned) and the turn itself (learned).
    """
    out: list[tuple[str, bool]] = []
    done = ""
    for k, m in enumerate(msgs):
        if m["role"] == "assistant":
            prefix = tokenizer.apply_chat_template(
                msgs[:k], tokenize=False, add_generation_prompt=True
            )
            if prefix.startswith(done):
                out.append((prefix[len(done) :], False))
                done = prefix
        full = tokenizer.apply_chat_template(msgs[: k + 1], tokenize=False)
        if not full.startswith(done):
            raise InputError(
                "the tokenizer's chat template renders a chat differently when it grows; "
                "set task.template=simple"
            )
        out.append((full[len(done) :], m["role"] == "assistant"))
        done = full
    return out
