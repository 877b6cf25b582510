"""The preference losses, on the log-probabilities the causal LM gives its sequences.

The wrapped module (ORTModule's graph) ends at the next-token log-probabilities of the
positions the loss reads (``token_logps``, ``read_positions``: the head runs at those alone);
everything here runs outside it, in PyTorch. A batch is the
chosen sequences then the rejected ones, concatenated on the batch dimension (one forward for
both, as TRL's ``DPOTrainer`` does). The formulas are TRL 1.16.0's (docs/preference.md cites
the lines): DPO is ``loss_type="sigmoid"`` (with ``label_smoothing``: the conservative DPO of
TRL's earlier releases), IPO ``loss_type="ipo"`` (per-token averaged log-ratios), ORPO
``trl.experimental.orpo`` (the chosen sequence's NLL over every attended token, minus beta
times the log-sigmoid of the log odds ratio of the per-token averaged log-probs).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ortft.core.constants import IGNORE_INDEX
from ortft.families.preference import sharing
from ortft.tasks import lm_head


def token_logps(
    model: Any,
    input_ids: Any,
    attention_mask: Any,
    index: Any = None,
    targets: Any = None,
    position_ids: Any = None,
) -> Any:
    """Each position's log-probability of the next token, [rows, length - 1] (a log-softmax
    and a gather: ORT 1.19 builds no gradient for a ReduceLogSumExp); with ``index``
    (``lm_head.next_positions``) only those positions', flat, the head run at them alone
    where the model allows (``lm_head.split``). ``task.share_prefix``'s rows
    (``sharing.shared``) come with a 3D ``attention_mask`` (query by key), their
    ``position_ids`` and the ``targets`` each position of ``index`` predicts (not the next
    token of its row)."""
    extra = {} if position_ids is None else {"position_ids": position_ids}
    if attention_mask.dim() == 3:  # shared rows: [rows, length, length]
        attention_mask = sharing.attention_for(model, attention_mask)
    if index is not None and targets is None:
        targets = lm_head.next_tokens(input_ids, index)
    parts = None if index is None else lm_head.split(model)
    if parts is not None:
        body, head = parts
        hidden = lm_head.hidden_states(body, input_ids, attention_mask, **extra)
        logps = torch.log_softmax(lm_head.project(head, hidden, index).float(), dim=-1)
        return logps.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    logits = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        use_cache=False,
        return_dict=True,
        **extra,
    ).logits
    if index is not None:
        logps = torch.log_softmax(lm_head.at(logits, index).float(), dim=-1)
        return logps.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    logps = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    return logps.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)


def pick(token: Any, index: Any) -> Any:
    """The values of ``token`` [rows, length - 1] at the flat positions ``index`` (what
    ``token_logps`` gives with an index; ``spread`` undoes it)."""
    return F.pad(token, (0, 1)).reshape(-1).index_select(0, index)  # already shifted by one


def read_positions(kind: str, labels: Any, attention_mask: Any) -> Any:
    """The flat positions (``lm_head.next_positions``) whose log-probs ``preference_loss``
    reads: the responses' for DPO and IPO, every attended token's for ORPO (its chosen NLL)."""
    counted = attention_mask.bool() if kind == "orpo" else labels != IGNORE_INDEX
    return lm_head.next_positions(counted)


def spread(values: Any, index: Any, rows: int, length: int) -> Any:
    """``token_logps`` at ``index`` back in its [rows, length - 1] layout, zeros elsewhere
    (``preference_loss`` weighs only the positions read)."""
    flat = values.new_zeros(rows * length).index_copy(0, index, values)
    return flat.view(rows, length)[:, :-1]


def log1mexp(x: torch.Tensor) -> torch.Tensor:
    """log(1 - exp(x)) for x < 0, branching at -ln 2 as TRL's ORPO does."""
    t = -0.6931471805599453
    return torch.where(x < t, torch.log1p(-torch.exp(x)), torch.log(-torch.expm1(x)))


def preference_loss(
    kind: str,
    beta: float,
    label_smoothing: float,
    token: torch.Tensor,
    batch: dict[str, torch.Tensor],
    sft_weight: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(the mean loss over the batch's pairs, the [pairs, 2] chosen and rejected rewards) from
    ``token`` (``token_logps`` of the chosen then the rejected sequences); ``batch``: ``labels`` (chosen then rejected, concatenated), ``attention_mask``, and for
    DPO/IPO ``ref_chosen`` / ``ref_rejected`` (the reference's summed log-probs); an eval
    batch's padded copies (chosen labels all -100) weigh nothing. ``sft_weight`` (DPO, IPO)
    adds that times the chosen responses' mean token NLL, an anchor that keeps them likely."""
    response = (batch["labels"][:, 1:] != IGNORE_INDEX).to(token.dtype)
    sums = (token * response).sum(1)
    counts = response.sum(1)
    pairs = len(sums) // 2
    weight = (counts[:pairs] > 0).to(token.dtype)  # padded eval copies: no chosen label
    mean = weight / weight.sum().clamp(min=1.0)
    chosen, rejected = sums[:pairs], sums[pairs:]
    if kind == "orpo":
        avg = sums / counts.clamp(min=1.0)
        c, r = avg[:pairs], avg[pairs:]
        log_odds = (c - r) - (log1mexp(c) - log1mexp(r))
        # the chosen NLL over every attended token after the first, as TRL's ORPO
        seen = batch["attention_mask"][:pairs, 1:].to(token.dtype) * weight[:, None]
        nll = -(token[:pairs] * seen).sum() / seen.sum().clamp(min=1.0)
        loss = nll - beta * (F.logsigmoid(log_odds) * mean).sum()
        return loss, torch.stack([beta * c, beta * r], 1).detach()
    chosen_ratio = chosen - batch["ref_chosen"].to(token.dtype)
    rejected_ratio = rejected - batch["ref_rejected"].to(token.dtype)
    if kind == "ipo":
        delta = chosen_ratio / counts[:pairs].clamp(min=1.0)
        delta = delta - rejected_ratio / counts[pairs:].clamp(min=1.0)
        per_pair = (delta - 1 / (2 * beta)) ** 2
    else:
        margin = beta * (chosen_ratio - rejected_ratio)
        per_pair = -(1 - label_smoothing) * F.logsigmoid(margin)
        per_pair = per_pair - label_smoothing * F.logsigmoid(-margin)
    rewards = torch.stack([beta * chosen_ratio, beta * rejected_ratio], 1).detach()
    loss = (per_pair * mean).sum()
    if sft_weight:  # TRL's loss_type ["sigmoid", "sft"]: the chosen tokens' mean NLL
        chosen_tokens = response[:pairs]
        nll = -(token[:pairs] * chosen_tokens).sum() / chosen_tokens.sum().clamp(min=1.0)
        loss = loss + sft_weight * nll
    return loss, rewards


def concatenated(batch: dict[str, Any]) -> dict[str, Any]:
    """The chosen sequences then the rejected ones, on the batch dimension: one forward."""
    return {
        key: torch.cat([batch[key], batch[f"rejected_{key}"]], 0)
        for key in ("input_ids", "attention_mask", "labels")
    }


def preference_scores(model: Any, batch: dict[str, Any]) -> torch.Tensor:
    """[pairs, 2]: each pair's chosen and rejected summed response log-probs under ``model``."""
    both = concatenated(batch)
    token = token_logps(model, both["input_ids"], both["attention_mask"])
    response = (both["labels"][:, 1:] != IGNORE_INDEX).to(token.dtype)
    sums = (token * response).sum(1)
    return torch.stack(sums.chunk(2), 1)
