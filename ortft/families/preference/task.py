"""preference: a causal LM tuned on preference pairs (DPO, IPO or ORPO); the options and how a
row becomes one example of two sequences.

Rows: ``{prompt, chosen, rejected}`` strings, or the conversation form: ``chosen`` and
``rejected`` message lists (``[{"role", "content"}, ...]``) that share every message but the
last, an assistant turn (or a ``prompt`` message list and one-message ``chosen``/``rejected``
lists, as TRL's conversational rows). Each sequence is the prompt formatted as the instruction
task formats it (the tokenizer's chat template when it has one, else its simple template) and
the response; only response tokens carry labels. The chosen sequence is ``input_ids`` /
``attention_mask`` / ``labels``, the rejected one ``rejected_input_ids`` /
``rejected_attention_mask`` / ``rejected_labels``; ``_length`` is the longer of the two, so a
cut batch keeps both whole.

Truncation: a prompt longer than ``task.max_prompt_length`` tokens keeps its last tokens
(``task.truncation: keep_end``, TRL's name for it) or its first (``keep_start``); then each
response is cut to what ``data.max_length`` leaves.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from pydantic import Field, model_validator

from ortft.core.constants import IGNORE_INDEX
from ortft.core.errors import InputError
from ortft.families.generation.instruction import Instruction
from ortft.tasks.base import Encoded, TaskOptions

SEQUENCES = ("", "rejected_")  # the array prefixes of the chosen and the rejected sequence
REJECTED = tuple(f"rejected_{key}" for key in ("input_ids", "attention_mask", "labels"))
# A margin this small is a tie, which counts as wrong. Before training a DPO policy is its
# reference, and an untrained reward head's rewards differ on pairs that share most tokens:
# both by rounding alone, which must not score about half the pairs right (it did, at margins
# that print as 0.0000).
TIE = 1e-4
LOSSES = ("dpo", "ipo", "orpo")


class PairOptions(TaskOptions):
    """The options of a task on preference pairs (preference, reward-model): the columns,
    the prompt's template and its truncation."""

    max_prompt_length: int | None = Field(
        None,
        gt=0,
        description="preference, reward-model: prompt tokens kept (default: no limit but max_length).",
    )
    truncation: Literal["keep_end", "keep_start"] = Field(
        "keep_end",
        description="preference, reward-model: which end of a long prompt max_prompt_length keeps (TRL's names).",
    )
    prompt_column: str = Field(
        "prompt", description="preference, reward-model: column with the prompt."
    )
    chosen_column: str = Field(
        "chosen", description="preference, reward-model: column with the chosen response."
    )
    rejected_column: str = Field(
        "rejected", description="preference, reward-model: column with the rejected response."
    )
    template: Literal["auto", "simple"] = Field(
        "auto",
        description="preference, reward-model: auto uses the tokenizer's chat template when it has one, else "
        "the instruction task's simple template; simple always uses the latter.",
    )


class Options(PairOptions):
    name: Literal["preference"] = "preference"
    loss: Literal["dpo", "ipo", "orpo"] = Field(
        "dpo",
        description="preference: dpo (sigmoid of beta times the reward margin), ipo (squared "
        "distance of the per-token margin from 1/(2 beta)) or orpo (the chosen NLL minus beta "
        "times the log-sigmoid of the odds ratio; no reference model).",
    )
    beta: float = Field(
        0.1, gt=0, description="preference: DPO/IPO's beta (IPO's tau), ORPO's lambda."
    )
    label_smoothing: float = Field(
        0.0,
        ge=0,
        lt=0.5,
        description="preference, dpo: the conservative DPO's epsilon, the assumed share of "
        "flipped pairs (0: plain DPO).",
    )
    sft_weight: float = Field(
        0.0,
        ge=0,
        description="preference, dpo/ipo: add this weight times the chosen responses' mean "
        "token NLL (TRL's loss_type [sigmoid, sft] with loss_weights [1, w]): DPO alone may make "
        "the chosen answers less likely too.",
    )

    share_prefix: Literal[False, True, "auto"] = Field(
        "auto",
        description="preference: each pair runs as one sequence: the tokens its chosen and "
        "rejected sequences share (the prompt, and their responses' common start) once, then "
        "each response's rest, the rejected one's masked from the chosen one's: the same "
        "log-probs from fewer tokens (docs/preference.md#speed). auto: where the model's "
        "type takes it (gpt2, gpt_neox, llama, qwen2, qwen3, phi3, without a sliding window); "
        "true: the same, an error elsewhere; false: two rows a pair, as TRL's DPOTrainer.",
    )

    @model_validator(mode="after")
    def _loss_options(self) -> Options:
        if self.loss == "orpo" and self.sft_weight:
            raise ValueError(
                "task.sft_weight: orpo has its own NLL term (task.beta weighs the other)"
            )
        return self


class PairRows:
    """How a preference row becomes token arrays (the task's ``encode``)."""

    def __init__(self, options: PairOptions):
        self.o = options
        # the instruction task formats the prompt and each response, as it does its examples
        self.formatter = Instruction(messages_column="messages", template=options.template)

    def _response(self, value: Any, i: int, which: str) -> Any:
        if isinstance(value, str | list):
            return value
        if isinstance(value, int | float):  # datasets' Json column: a string "7" comes back as 7
            raise InputError(
                f"row {i + 1}: {which} is the number {value}, not a string or a message list "
                "(a file mixing string and message-list rows decodes a response that is a bare "
                "number as one: keep one row form per file)"
            )
        raise InputError(f"row {i + 1}: {which} must be a string or a message list")

    def conversations(self, row: dict[str, Any], i: int) -> tuple[list[dict], list[dict]]:
        """The chosen and rejected chats (each ends with the response, an assistant turn)."""
        o = self.o
        missing = [c for c in (o.chosen_column, o.rejected_column) if c not in row]
        if missing:
            raise InputError(
                f"row {i + 1}: needs {', '.join(missing)} (has: {', '.join(sorted(map(str, row)))})"
            )
        chosen = self._response(row[o.chosen_column], i, o.chosen_column)
        rejected = self._response(row[o.rejected_column], i, o.rejected_column)
        prompt = row.get(o.prompt_column)
        if isinstance(chosen, str) and isinstance(rejected, str):
            if prompt is None:
                raise InputError(f"row {i + 1}: needs {o.prompt_column} with string responses")
            chosen = [{"role": "assistant", "content": chosen}]
            rejected = [{"role": "assistant", "content": rejected}]
        if not (isinstance(chosen, list) and isinstance(rejected, list)):
            raise InputError(f"row {i + 1}: chosen and rejected must both be strings or lists")
        shared: Any = []
        if prompt is not None:
            shared = (
                [{"role": "user", "content": str(prompt)}] if isinstance(prompt, str) else prompt
            )
        chats = []
        for name, msgs in ((o.chosen_column, chosen), (o.rejected_column, rejected)):
            chat = self.formatter._messages({"messages": list(shared) + list(msgs)}, i)
            if chat[-1]["role"] != "assistant":
                raise InputError(f"row {i + 1}: {name} must end with an assistant message")
            if not chat[-1]["content"].strip():
                raise InputError(f"row {i + 1}: {name} has an empty response")
            chats.append(chat)
        if chats[0][:-1] != chats[1][:-1]:
            raise InputError(f"row {i + 1}: chosen and rejected do not share their prompt messages")
        if chats[0][-1] == chats[1][-1]:
            raise InputError(f"row {i + 1}: chosen and rejected are the same response")
        return chats[0], chats[1]

    def _split(self, chat: list[dict], i: int, tokenizer: Any) -> tuple[str, str]:
        """(prompt text, response text): everything before the last learned piece, and it."""
        pieces = self.formatter._segments({"messages": chat}, i, tokenizer)
        last = max(k for k, (_, learned) in enumerate(pieces) if learned)
        return "".join(t for t, _ in pieces[:last]), "".join(t for t, _ in pieces[last:])

    def texts(self, row: dict[str, Any], i: int) -> list[str]:
        """The row's texts in the simple template (a tokenizer trained from the rows)."""
        return ["".join(self._split(chat, i, None)) for chat in self.conversations(row, i)]

    def example(self, row: dict[str, Any], i: int, tokenizer: Any, limit: int) -> list[tuple]:
        """[(ids, labels)] for the chosen and the rejected sequence."""
        return [self.sequence(chat, i, tokenizer, limit) for chat in self.conversations(row, i)]

    def sequence(self, chat: list[dict], i: int, tokenizer: Any, limit: int) -> tuple:
        """(ids, labels) of one chat ending with its response: the prompt cut as the options
        say, then the response cut to what ``limit`` leaves; labels on the response only."""
        prompt, response = self._split(chat, i, tokenizer)
        p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        r = tokenizer(response, add_special_tokens=False)["input_ids"]
        keep = self.o.max_prompt_length
        if keep is not None and len(p) > keep:
            p = p[-keep:] if self.o.truncation == "keep_end" else p[:keep]
        r = r[: max(limit - len(p), 0)]
        if not r:
            raise InputError(
                f"row {i + 1}: no response token within data.max_length={limit} "
                f"(the prompt has {len(p)}; set task.max_prompt_length)"
            )
        return p + r, [IGNORE_INDEX] * len(p) + r

    def encode(self, rows: list[dict[str, Any]], tokenizer: Any, limit: int) -> Encoded:
        pairs = [self.example(r, i, tokenizer, limit) for i, r in enumerate(rows)]
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        arrays: dict[str, np.ndarray] = {}
        for s, prefix in enumerate(SEQUENCES):
            ids = np.full((len(pairs), limit), pad, dtype=np.int64)
            mask = np.zeros((len(pairs), limit), dtype=np.int64)
            labels = np.full((len(pairs), limit), IGNORE_INDEX, dtype=np.int64)
            for b, pair in enumerate(pairs):
                seq, lab = pair[s]
                ids[b, : len(seq)], mask[b, : len(seq)], labels[b, : len(seq)] = seq, 1, lab
            arrays |= {
                f"{prefix}input_ids": ids,
                f"{prefix}attention_mask": mask,
                f"{prefix}labels": labels,
            }
        both = np.maximum(arrays["attention_mask"].sum(1), arrays["rejected_attention_mask"].sum(1))
        arrays["_length"] = both.astype(np.int32)
        return Encoded(arrays)
