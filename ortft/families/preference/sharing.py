"""``task.share_prefix``: each pair runs as one sequence, its shared prefix once.

A pair's chosen and rejected sequences begin with the same tokens: the prompt, and often the
start of both responses. In a causal LM a position's hidden state depends only on the tokens up
to it, so those tokens' states are the same in both sequences. TRL's ``DPOTrainer`` runs the
two sequences as two rows of one batch, computing the shared tokens twice. Here a pair is one
row::

    [shared prefix | the chosen sequence's rest | the rejected sequence's rest]

The rejected rest's tokens take the positions they have in the rejected sequence (position ids
restart at the prefix's length), and an attention mask keeps them from seeing the chosen rest.
So each token attends to exactly the tokens it attends to in its own sequence, and each
log-probability the loss reads is the one the two-row batch gives (tests/test_preference_share.py
checks the log-probs and the gradients against it).

The mask is a boolean ``[pairs, length, length]`` (True: may attend; ONNX Runtime's shape
inference would tie a head axis given as an input to the heads' count), made 4D inside the
wrapped module: transformers' decoders take a 4D mask as it is. Eager attention adds it, so
``attention_for`` turns it into zeros and a large negative there. A padded position may attend
to every real token before it, so that no row of the softmax is all masked (``backend.unpad``
finds the real positions of a 4D mask as the keys some query may attend to).

The log-probs come back in the order ``read_positions`` gives for the two-row batch, so the
losses read them as they do there. Where it applies (``applies``): the models whose forward
takes position ids and a 4D mask as they are (``MODEL_TYPES``), with no sliding window, whose
mask a given one would replace.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ortft.tasks import lm_head

# causal LMs whose forward takes a 4D mask and position ids as given (Mistral and Gemma are
# left out: their sliding windows are on in the released configs)
MODEL_TYPES = frozenset({"gpt2", "gpt_neox", "llama", "qwen2", "qwen3", "phi3"})


def applies(config: Any) -> str | None:
    """None where a model of ``config`` takes the shared rows, else why not."""
    kind = getattr(config, "model_type", None)
    if kind not in MODEL_TYPES:
        return f"a {kind} model's forward is not known to take the shared rows' mask as given"
    if hasattr(config, "use_sliding_window"):  # Qwen2, Qwen3: a window only where switched on
        windowed = bool(config.use_sliding_window)
    else:  # Phi-3's released configs set one
        windowed = getattr(config, "sliding_window", None) is not None
    if windowed:
        return f"this {kind} model attends within a sliding window, which the mask would replace"
    return None


@dataclass
class Layout:
    """One row a pair (``shared``): what the wrapped module takes."""

    input_ids: torch.Tensor  # [pairs, length]
    attention_mask: torch.Tensor  # [pairs, length, length], bool (``attention_for``: 4D)
    position_ids: torch.Tensor  # [pairs, length]
    index: torch.Tensor  # flat positions into [pairs x length] whose log-probs the loss reads
    targets: torch.Tensor  # the token each of them predicts


def prefix_lengths(both: dict[str, torch.Tensor]) -> torch.Tensor:
    """[pairs]: how many leading tokens each pair's chosen and rejected sequences share."""
    ids, mask = both["input_ids"], both["attention_mask"]
    pairs = len(ids) // 2
    same = (ids[:pairs] == ids[pairs:]) & (mask[:pairs] != 0) & (mask[pairs:] != 0)
    return same.long().cumprod(1).sum(1)


def shared(both: dict[str, torch.Tensor], index: torch.Tensor) -> Layout:
    """The pairs of ``both`` (``losses.concatenated``: chosen rows then rejected rows, each
    right-padded) as one row each; ``index``: the flat positions the loss reads in ``both``
    (``losses.read_positions``), given here in the one-row layout with their targets."""
    ids, mask = both["input_ids"], both["attention_mask"]
    pairs, width = len(ids) // 2, ids.shape[1]
    lengths = mask.sum(1)
    chosen, rejected = lengths[:pairs, None], lengths[pairs:, None]
    prefix = prefix_lengths(both)[:, None]
    ends = chosen + rejected - prefix  # each row's length
    t = torch.arange(int(ends.max()), device=ids.device)[None]
    in_chosen = t < chosen
    in_rejected = ~in_chosen & (t < ends)
    from_rejected = (t - chosen + prefix).clamp(0, width - 1)  # its position in that sequence
    tokens = torch.where(
        in_chosen,
        ids[:pairs].gather(1, t.clamp(max=width - 1).expand(pairs, -1)),
        torch.where(in_rejected, ids[pairs:].gather(1, from_rejected), 0),  # 0: padding
    )
    positions = torch.where(in_chosen, t, torch.where(in_rejected, from_rejected, 0))
    real = in_chosen | in_rejected
    rest_of_chosen = in_chosen & (t >= prefix)
    causal = t[:, :, None] >= t[:, None, :]  # [1, query, key]
    blocked = in_rejected[:, :, None] & rest_of_chosen[:, None, :]
    allowed = causal & real[:, None, :] & ~blocked
    return Layout(
        input_ids=tokens,
        attention_mask=allowed,
        position_ids=positions,
        index=_moved(index, width, chosen, prefix, t.shape[1]),
        targets=lm_head.next_tokens(ids, index),
    )


def _moved(
    index: torch.Tensor, width: int, chosen: torch.Tensor, prefix: torch.Tensor, length: int
) -> torch.Tensor:
    """Flat positions into the two-row batch [2 x pairs, width] -> into the one-row layout
    [pairs, length]: a chosen row's position stays; a rejected row's past the prefix moves
    past the chosen sequence's rest."""
    pairs = len(chosen)
    row, t = index // width, index % width
    pair = row % pairs
    past = (row >= pairs) & (t >= prefix[pair, 0])
    shift = (chosen[pair, 0] - prefix[pair, 0]) * past
    return pair * length + t + shift


def attention_for(model: Any, allowed: torch.Tensor) -> torch.Tensor:
    """The [pairs, length, length] mask as ``model``'s attention takes it, 4D: eager attention
    adds the mask to its scores (0 where allowed, the float32 minimum elsewhere, as
    transformers' own eager mask); SDPA takes the booleans."""
    allowed = allowed[:, None]
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) != "eager":
        return allowed
    zero = torch.zeros((), dtype=torch.float32, device=allowed.device)
    return torch.where(allowed, zero, torch.finfo(torch.float32).min)
