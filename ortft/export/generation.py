"""Generation for ONNX graphs as transformers' ``generate`` does it, from a generation config.

``generate`` reads the model's ``generation_config.json`` (forced BOS/EOS, no_repeat_ngram_size,
min/max lengths, repetition_penalty, suppressed tokens, num_beams, length_penalty,
early_stopping, eos/pad ids) and applies it through logits processors and a search. The ONNX
loops (the export's generation check, ``ortft predict`` on an export) do the same here: ``plan``
builds transformers' own processors (public classes of ``transformers.generation``) in the order
``GenerationMixin._get_logits_processor`` does; ``greedy`` and ``beam_search`` are ports of its
``_sample`` (do_sample off) and ``_beam_search`` over a ``Steps`` (one ONNX step a call, its
cache reordered when the beams change). The search state is torch tensors so that the top-k
choices and ties break as transformers breaks them; transformers 5.24 has no public
``BeamSearchScorer`` left to call. Sampling is not done: ortft decodes deterministically, so
``do_sample`` is switched off on both sides (``deterministic``).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

# generation_config fields that generate would apply and this module does not: a config that
# sets one is refused (``unsupported``) instead of silently giving other text than PyTorch
UNSUPPORTED = {
    "guidance_scale": lambda v: v is not None and v != 1,
    "encoder_repetition_penalty": lambda v: v is not None and v != 1.0,
    "encoder_no_repeat_ngram_size": lambda v: bool(v),
    "num_return_sequences": lambda v: v is not None and v > 1,
    "stop_strings": lambda v: bool(v),
    "max_time": lambda v: v is not None,
    "watermarking_config": lambda v: v is not None,
    "prompt_lookup_num_tokens": lambda v: v is not None,
    # other search modes than greedy and beam search
    "penalty_alpha": lambda v: bool(v),
    "num_beam_groups": lambda v: v is not None and v > 1,
    "constraints": lambda v: v is not None,
    "force_words_ids": lambda v: v is not None,
    "dola_layers": lambda v: v is not None,
    "token_healing": lambda v: bool(v),
}


class Steps(Protocol):
    """One decoder step of an ONNX graph: feed the new tokens [rows, n] (the whole prompt on the
    first call), get the last position's logits [rows, vocab]; ``reorder`` picks cache rows."""

    def __call__(self, tokens: np.ndarray) -> np.ndarray: ...

    def reorder(self, rows: np.ndarray) -> None: ...


def load(folder: Path, model_config: Any) -> Any:
    """The generation config saved with a model (``generation_config.json``), else the one
    transformers derives from its config.json (as ``from_pretrained`` does)."""
    from transformers import GenerationConfig

    try:
        return GenerationConfig.from_pretrained(folder)
    except OSError:  # no generation_config.json
        return GenerationConfig.from_model_config(model_config)


def save(model: Any, folder: Path) -> None:
    """config.json and, for a model that generates, generation_config.json into ``folder``."""
    model.config.save_pretrained(folder)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(folder)


def deterministic(gc: Any, **fields: Any) -> Any:
    """A copy of ``gc`` with sampling off and ``fields`` set (what both sides decode with)."""
    gc = copy.deepcopy(gc)
    gc.do_sample = False
    for key, value in fields.items():
        setattr(gc, key, value)
    return gc


def unsupported(gc: Any) -> list[str]:
    return [k for k, bad in UNSUPPORTED.items() if bad(getattr(gc, k, None))]


@dataclass
class Plan:
    """A generation config resolved for one prompt length, as ``generate`` resolves it."""

    config: Any  # the GenerationConfig: defaults filled in, max/min_length absolute
    processors: Any  # LogitsProcessorList
    stopping: Any  # StoppingCriteriaList: max length, eos
    eos: torch.Tensor | None  # 1-D
    pad: int

    @property
    def num_beams(self) -> int:
        return int(self.config.num_beams or 1)


def plan(
    gc: Any, prompt_len: int, *, encoder_decoder: bool, max_positions: int | None = None
) -> Plan:
    """``gc`` (a model's generation config, with any overrides already set) resolved as
    ``generate`` does for ``prompt_len`` tokens of (decoder) input: global defaults for unset
    values, lengths (``_prepare_generated_length``), special tokens and the processors."""
    from transformers.generation import stopping_criteria as sc

    default_max = gc.max_length is None
    gc = copy.deepcopy(gc)
    gc.update(**gc._get_default_generation_params(), defaults_only=True)
    if gc.max_new_tokens is not None:
        gc.max_length = gc.max_new_tokens + prompt_len
    elif default_max:  # generate's default: 20 new tokens, within the positions
        gc.max_length = gc.max_length + prompt_len
        if max_positions is not None:
            gc.max_length = min(gc.max_length, max_positions)
    if gc.min_new_tokens is not None:
        gc.min_length = gc.min_new_tokens + prompt_len
    eos = None if gc.eos_token_id is None else torch.tensor(gc.eos_token_id).reshape(-1)
    pad = (
        gc.pad_token_id if gc.pad_token_id is not None else (int(eos[0]) if eos is not None else 0)
    )
    stopping = sc.StoppingCriteriaList([sc.MaxLengthCriteria(gc.max_length, max_positions)])
    if eos is not None:
        stopping.append(sc.EosTokenCriteria(eos))
    return Plan(gc, _processors(gc, eos, prompt_len, encoder_decoder), stopping, eos, int(pad))


def _processors(gc: Any, eos: torch.Tensor | None, prompt_len: int, encoder_decoder: bool):
    """The processors ``_get_logits_processor`` builds for ``gc``, in its order."""
    from transformers.generation import logits_process as lp

    out = lp.LogitsProcessorList()
    if gc.sequence_bias is not None:
        out.append(lp.SequenceBiasLogitsProcessor(sequence_bias=gc.sequence_bias))
    if gc.repetition_penalty is not None and gc.repetition_penalty != 1.0:
        # generate skips a left padding of the prompt; ortft's prompts are unpadded rows (0),
        # and an encoder-decoder's decoder input has no mask there (None)
        ignore = None if encoder_decoder else 0
        out.append(lp.RepetitionPenaltyLogitsProcessor(gc.repetition_penalty, ignore))
    if gc.no_repeat_ngram_size:
        out.append(lp.NoRepeatNGramLogitsProcessor(gc.no_repeat_ngram_size))
    if gc.bad_words_ids is not None:
        out.append(lp.NoBadWordsLogitsProcessor(gc.bad_words_ids, eos))
    if gc.min_length and eos is not None:
        out.append(lp.MinLengthLogitsProcessor(gc.min_length, eos))
    if gc.min_new_tokens and eos is not None:
        out.append(lp.MinNewTokensLengthLogitsProcessor(prompt_len, gc.min_new_tokens, eos))
    if gc.forced_bos_token_id is not None:
        out.append(lp.ForcedBOSTokenLogitsProcessor(gc.forced_bos_token_id))
    if gc.forced_eos_token_id is not None:
        out.append(lp.ForcedEOSTokenLogitsProcessor(gc.max_length, gc.forced_eos_token_id))
    if gc.remove_invalid_values is True:
        out.append(lp.InfNanRemoveLogitsProcessor())
    if gc.exponential_decay_length_penalty is not None:
        out.append(
            lp.ExponentialDecayLengthPenalty(gc.exponential_decay_length_penalty, eos, prompt_len)  # type: ignore[arg-type]
        )
    if gc.suppress_tokens is not None:
        out.append(lp.SuppressTokensLogitsProcessor(gc.suppress_tokens))
    if gc.begin_suppress_tokens is not None:
        begin = prompt_len if (prompt_len > 1 or gc.forced_bos_token_id is None) else prompt_len + 1
        out.append(lp.SuppressTokensAtBeginLogitsProcessor(gc.begin_suppress_tokens, begin))
    if gc.renormalize_logits is True:
        out.append(lp.LogitNormalization())
    return out


def generate(steps: Steps, input_ids: np.ndarray, p: Plan) -> tuple[np.ndarray, list[np.ndarray]]:
    """(sequences as ``generate`` returns them: the input, then the new tokens, finished rows
    padded; the raw logits of each step, [rows x beams, vocab]) by greedy or beam search."""
    search = beam_search if p.num_beams > 1 else greedy
    return search(steps, torch.from_numpy(np.asarray(input_ids, dtype=np.int64)), p)


def greedy(steps: Steps, ids: torch.Tensor, p: Plan) -> tuple[np.ndarray, list[np.ndarray]]:
    """``GenerationMixin._sample`` without sampling."""
    unfinished = torch.ones(len(ids), dtype=torch.bool)
    raw: list[np.ndarray] = []
    new = ids
    while True:
        logits = torch.from_numpy(np.asarray(steps(new.numpy()), dtype=np.float32))
        raw.append(logits.numpy())
        tokens = torch.argmax(p.processors(ids, logits.clone()), dim=-1)
        if p.eos is not None:
            tokens = torch.where(unfinished, tokens, torch.tensor(p.pad))
        ids = torch.cat([ids, tokens[:, None]], dim=-1)
        unfinished &= ~p.stopping(ids, None)
        if not unfinished.any():
            return ids.numpy(), raw
        new = tokens[:, None]


def _gather(t: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    while idx.dim() < t.dim():
        idx = idx.unsqueeze(-1)
    return torch.take_along_dim(t, idx, dim=1)


def beam_search(steps: Steps, ids: torch.Tensor, p: Plan) -> tuple[np.ndarray, list[np.ndarray]]:
    """``GenerationMixin._beam_search`` (transformers 5.24) without sampling, for ``ids`` of one
    row per input: each row is expanded to ``num_beams`` rows first, as generate expands it."""
    gc, k = p.config, p.num_beams
    batch, prompt_len = ids.shape
    ids = ids.repeat_interleave(k, dim=0)
    max_length, penalty, early = gc.max_length, gc.length_penalty, gc.early_stopping
    keep = max(2, 1 + (len(p.eos) if p.eos is not None else 0)) * k
    top_mask = torch.arange(keep) < k
    # generate's fill: ``pad_token_id or eos_token_id[0]``, so a pad id of 0 (T5) fills with eos
    fill = (p.pad or int(p.eos[0])) if p.eos is not None else -1
    running = torch.full((batch, k, max_length), fill, dtype=torch.int64)
    running[:, :, :prompt_len] = ids.view(batch, k, prompt_len)
    sequences = running.clone()
    running_scores = torch.zeros((batch, k))
    running_scores[:, 1:] = -1e9
    scores = torch.full((batch, k), -1e9)
    finished = torch.zeros((batch, k), dtype=torch.bool)
    improvable = torch.ones((batch, 1), dtype=torch.bool)
    running_idx = torch.full((batch, k, max_length - prompt_len), -1, dtype=torch.int32)
    beam_idx = running_idx.clone()
    raw: list[np.ndarray] = []
    cur, new, flat = prompt_len, ids, ids
    while True:
        logits = torch.from_numpy(np.asarray(steps(new.numpy()), dtype=np.float32))
        raw.append(logits.numpy())
        log_probs = p.processors(flat, torch.nn.functional.log_softmax(logits, dim=-1))
        log_probs = (log_probs.view(batch, k, -1) + running_scores[:, :, None]).view(batch, -1)
        # c. the top `keep` continuations over all beams
        top_lp, top_i = torch.topk(log_probs, k=keep)
        vocab = log_probs.shape[-1] // k
        from_beam = top_i // vocab
        top_idx = _gather(running_idx, from_beam)
        top_seq = _gather(running, from_beam)
        top_seq[:, :, cur] = top_i % vocab
        top_idx[:, :, cur - prompt_len] = from_beam + torch.arange(batch).view(-1, 1) * k
        # d. which of them hit a stopping criterion
        hits = p.stopping(top_seq[:, :, : cur + 1].reshape(batch * keep, -1), None)
        hits = hits.view(batch, keep)
        # e. the best `k` unfinished continue
        run_lp = top_lp + hits.to(torch.float32) * -1.0e9
        nxt = torch.topk(run_lp, k=k)[1]
        running, running_scores = _gather(top_seq, nxt), _gather(run_lp, nxt)
        running_idx = _gather(top_idx, nxt)
        # f. finished ones replace worse finished hypotheses
        done_now = hits & top_mask[None, :]
        final_lp = top_lp / ((cur + 1 - prompt_len) ** penalty)
        full = torch.all(finished, dim=-1, keepdim=True) & (early is True)
        final_lp = final_lp + full.to(torch.float32) * -1.0e9
        final_lp = final_lp + (~improvable).to(torch.float32) * -1.0e9
        final_lp = final_lp + (~done_now) * -1.0e9
        best = torch.topk(torch.cat((scores, final_lp), dim=1), k=k)[1]
        sequences = _gather(torch.cat((sequences, top_seq), dim=1), best)
        scores = _gather(torch.cat((scores, final_lp), dim=1), best)
        beam_idx = _gather(torch.cat((beam_idx, top_idx), dim=1), best)
        finished = _gather(torch.cat((finished, done_now), dim=1), best)
        # g. the cache follows the beams; stop when nothing can improve
        steps.reorder(running_idx[..., cur - prompt_len].reshape(-1).numpy())
        cur += 1
        improvable = _improvable(improvable, running_scores, scores, finished, cur, prompt_len, gc)
        go_on = improvable.any() & ~(finished.all() & (early is True)) & ~hits.all()
        if not go_on:
            break
        flat = running[:, :, :cur].reshape(batch * k, cur)
        new = flat[:, -1:]
    generated = int((beam_idx[:, 0] + 1).bool().sum(dim=1).max())
    return sequences[:, 0, : prompt_len + generated].numpy(), raw


def _improvable(improvable, running_scores, scores, finished, cur, prompt_len, gc):
    """``_check_early_stop_heuristic``: can a running beam still beat the worst finished one?"""
    if gc.early_stopping == "never" and gc.length_penalty > 0.0:
        length = gc.max_length - prompt_len
    else:
        length = cur - prompt_len
    best_running = running_scores[:, :1] / (length**gc.length_penalty)
    worst = torch.where(finished, torch.min(scores, dim=1, keepdim=True)[0], -1.0e9)
    return improvable & torch.any(best_running > worst, dim=-1, keepdim=True)
