"""What every generation check shares (a decoder's graph with its KV cache, seq2seq's pair of
graphs, speech's): the cache's names, the decoder inputs an encoder-decoder's forward builds
from its labels (``shift_right``: the teacher-forced parity), the model's generation config
as both sides run it, PyTorch's ``generate`` as the reference, and the step-by-step comparison
with it.

Names follow Optimum's decoders: inputs ``past_key_values.<layer>.key|value`` [batch, heads,
past, head_dim]; outputs ``present.<layer>.key|value`` [batch, heads, past + sequence,
head_dim]. A causal decoder's graph with its cache is the generation family's
(``ortft.families.generation.decoder_graph``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ortft.core.constants import IGNORE_INDEX

GENERATE_PROMPTS, GENERATE_TOKENS = 4, 16  # the generation check: prompts x new tokens
MIN_MARGIN = 1e-4  # top-2 logit margin below which a step is a tie, not a test of the graph


def past_names(n_layers: int, prefix: str = "past_key_values") -> list[str]:
    return [f"{prefix}.{i}.{kv}" for i in range(n_layers) for kv in ("key", "value")]


# mBART's forward starts the decoder from each target's last token (its language code), not
# from decoder_start_token_id (transformers' mbart ``shift_tokens_right``); fed T5's shift, a
# tiny mBART's teacher-forced logits differed by 0.75 from PyTorch's (tests/test_archs.py).
WRAP_LAST_TOKEN = ("mbart",)


def shift_right(labels: np.ndarray, pad: int, start: int, model_type: str) -> np.ndarray:
    """The decoder inputs the model's forward builds from ``labels`` (ignored positions: pad)."""
    targets = np.where(labels == IGNORE_INDEX, pad, labels)
    dec = np.full_like(targets, pad)
    dec[:, 1:] = targets[:, :-1]
    if model_type in WRAP_LAST_TOKEN:
        last = np.maximum((targets != pad).sum(axis=1) - 1, 0)
        dec[:, 0] = targets[np.arange(len(targets)), last]
    else:
        dec[:, 0] = start
    return dec.astype(np.int64)


def _margin(scores: np.ndarray) -> float:
    top2 = np.sort(scores.astype(np.float64))[-2:]
    return float(top2[1] - top2[0])


def check_config(model: Any, max_new_tokens: int) -> Any:
    """The model's generation config as the generation check runs it on both sides: sampling off,
    ``max_new_tokens``, and without the options ``ortft.export.generation`` does not apply."""
    from transformers import GenerationConfig

    from ortft.export import generation

    gc = getattr(model, "generation_config", None)
    gc = gc if gc is not None else GenerationConfig.from_model_config(model.config)
    gc = generation.deterministic(gc, max_new_tokens=max_new_tokens)
    for key in generation.unsupported(gc):
        setattr(gc, key, None)
    return gc


def reference(model: Any, gc: Any, **inputs: torch.Tensor) -> Any:
    """PyTorch's ``generate`` with ``gc``: the sequences, raw logits and processed scores."""
    from ortft.export import generation

    ref = generation.deterministic(
        gc, output_logits=True, output_scores=True, return_dict_in_generate=True
    )
    with torch.no_grad():
        return model.generate(**inputs, generation_config=ref)


def compare(
    ref: Any, seq: np.ndarray, raw: list[np.ndarray], start: int, eos: set[int], beams: int
) -> tuple[int, int, int, float]:
    """(steps compared, rows that diverged, rows stopped at a tie, max |logit diff|) of the ONNX
    loop's ``seq`` and ``raw`` logits against ``generate``'s ``ref``, new tokens from ``start``.
    Greedy: step by step, until a top-2 margin of the processed scores < ``MIN_MARGIN`` (a
    tie) or the row's eos. Beams: the whole sequences; the logits of every step when they agree
    (the beams then ran in the same order), else of the prompt's step."""
    want = ref.sequences.numpy()
    ref_logits = [t.float().numpy() for t in ref.logits]
    if beams > 1:
        width = max(want.shape[1], seq.shape[1])
        a, b = (
            np.pad(x, ((0, 0), (0, width - x.shape[1])), constant_values=-1) for x in (want, seq)
        )
        diverged = int(np.sum(np.any(a != b, axis=1)))
        steps = min(len(ref_logits), len(raw)) if diverged == 0 else 1
        diff = max(float(np.max(np.abs(raw[t] - ref_logits[t]))) for t in range(steps))
        return steps * len(want), diverged, 0, diff
    compared, diverged, ties, diff = 0, 0, 0, 0.0
    for row in range(len(want)):
        for t in range(min(len(ref_logits), len(raw))):
            if _margin(ref.scores[t][row].float().numpy()) < MIN_MARGIN:
                ties += 1
                break
            compared += 1
            diff = max(diff, float(np.max(np.abs(raw[t][row] - ref_logits[t][row]))))
            pos = start + t
            if pos >= seq.shape[1] or seq[row, pos] != want[row, pos]:
                diverged += 1
                break
            if int(want[row, pos]) in eos:
                break
    return compared, diverged, ties, diff


def method(gc: Any, max_new_tokens: int) -> str:
    """export.json's words for what the check ran."""
    beams = int(gc.num_beams or 1)
    how = f"beam search ({beams} beams)" if beams > 1 else "greedy"
    return (
        f"{how} with the model's generation config, up to {max_new_tokens} new tokens, against "
        f"transformers' generate; greedy steps compared until a top-2 margin < {MIN_MARGIN}"
    )


def section(
    head: dict[str, Any],
    totals: tuple[int, int, int],
    max_diff: float,
    tolerance: float,
    outputs_equal: bool | None = None,
) -> dict[str, Any]:
    """export.json's generation section: ``head`` (what ran: method, beams, inputs), then
    ``totals`` (steps compared, rows that diverged, rows stopped at a tie, as ``compare``
    counts them) and the verdict; ``outputs_equal``: whether the decoded outputs matched too,
    where the check compared them (speech)."""
    compared, mismatches, ties = totals
    out = {**head, "steps_compared": compared, "stopped_at_ties": ties, "mismatches": mismatches}
    if outputs_equal is not None:
        out["outputs_equal"] = outputs_equal
    passed = mismatches == 0 and compared > 0 and max_diff <= tolerance
    out.update(max_abs_diff=max_diff, tolerance=tolerance)
    out["passed"] = passed and (outputs_equal is None or bool(outputs_equal))
    return out
