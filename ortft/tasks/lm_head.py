"""A causal LM's head (the projection onto the vocabulary) run only where the loss reads it.

transformers' ``*ForCausalLM`` forward projects every position onto the vocabulary and its loss
then ignores the positions labelled -100: a prompt, an image's tokens, padding. Where the tasks
read only some positions (causal-lm and instruction: the labelled tokens; image-text-to-text:
the answers; preference tuning: the responses, or ORPO's attended tokens), they run the model's
body, take the hidden states at those positions (``next_positions``, found before the wrapped
module, so ORTModule's and inductor's graphs take them as an input) and project only those. At
a real vocabulary the head is much of a small model's step and its logits most of its
activation memory (docs/vision-language.md#speed, docs/preference.md#speed, docs/tasks.md).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ortft.core.constants import IGNORE_INDEX
from ortft.tasks import tracing

# The head runs on a multiple of this many rows (``project``): the positions a batch reads vary
# from batch to batch, and on a CPU's bf16 route oneDNN builds its kernels for each matrix height
# it has not seen. On the image-text-to-text peer (the head at 96-108 answer positions a batch,
# bf16 weights, Intel Xeon with AMX) every new height cost about 8 ms, in 12 of the first 30 steps
# of 25 ms (docs/vision-language.md#speed).
HEAD_ROWS = 16

# Model types whose causal LM's logits are the head applied to the body's last hidden state, with
# nothing after it (Gemma 2's final soft-capping, Cohere's logit scale and Granite's logit
# divisor are after it: those models run transformers' own forward).
PLAIN_HEAD = frozenset({"gpt2", "gpt_neox", "llama", "mistral", "phi3", "qwen2", "qwen3"})


def hidden_states(
    body: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, **extra: Any
) -> torch.Tensor:
    """The body's last hidden states [rows, length, width] in a training forward (no KV
    cache): what the head then runs on at the positions read."""
    out = body(
        input_ids=input_ids,
        attention_mask=attention_mask,
        use_cache=False,
        return_dict=True,
        **extra,
    )
    return out.last_hidden_state


def following(values: torch.Tensor, fill: Any) -> torch.Tensor:
    """Each position's next value of ``values`` [rows, length] (``fill`` after the last),
    flat over [rows x length]: what the flat positions of this module index."""
    return F.pad(values[:, 1:], (0, 1), value=fill).reshape(-1)


def next_positions(counted: torch.Tensor) -> torch.Tensor:
    """The flat indices, into [rows x length], of the positions whose *next* token is counted
    (``counted``: [rows, length] booleans): where a next-token loss reads the logits."""
    return following(counted, False).nonzero().squeeze(1)


def label_positions(labels: torch.Tensor) -> torch.Tensor:
    """``next_positions`` of the positions whose next label is not -100."""
    return next_positions(labels != IGNORE_INDEX)


def next_tokens(ids: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """The token each position of ``index`` predicts: ``ids`` [rows, length] shifted by one."""
    return following(ids, 0).index_select(0, index)


def at(hidden: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """The rows of hidden states [rows, length, width] at the flat positions ``index``."""
    return hidden.reshape(-1, hidden.shape[-1]).index_select(0, index)


def project(head: Any, hidden: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``head`` at the flat positions ``index`` of the hidden states [B, L, H]: [positions,
    vocabulary]. The head runs on ``index`` padded with repeats of its first position to a
    multiple of ``HEAD_ROWS`` rows, whose logits are then dropped (their gradient is zero). Not
    in a graph: ORTModule's export would fix the padding's length at the first batch's (ORT's
    CPU kernels build nothing per shape), and dynamo specialized the padding's length and
    compiled again for some counts (torch 2.13) or failed in inductor (torch 2.6)."""
    if tracing.traced():
        return head(at(hidden, index))
    n = index.shape[0]
    rows = torch.cat([index, index[:1].expand((-n) % HEAD_ROWS)])
    return head(at(hidden, rows))[:n]


def next_token_loss(
    head: Any, hidden: torch.Tensor, labels: torch.Tensor, index: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, logits): the mean next-token cross-entropy of ``labels`` (transformers'
    ``ForCausalLMLoss``), with ``head`` applied to the hidden states [B, L, H] only at ``index``
    (``label_positions``; computed here where the caller has not)."""
    if index is None:
        index = label_positions(labels)
    logits = project(head, hidden, index)
    targets = following(labels, IGNORE_INDEX).index_select(0, index)
    return F.cross_entropy(logits.float(), targets), logits


def split(model: Any) -> tuple[Any, Any] | None:
    """(body, head) of a causal LM whose logits are its head on its body's last hidden state
    (``PLAIN_HEAD``; inside a peft wrapper, whose LoRA layers sit in the model in place), else
    None: that model runs transformers' own forward."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if getattr(base.config, "model_type", None) not in PLAIN_HEAD:
        return None
    body, head = base.base_model, base.get_output_embeddings()
    return (body, head) if body is not base and head is not None else None
