"""What a decoder's weight-only int4 export (``model.int4.onnx``, ``ortft.export.int4``) does
to its generations, against the fp32 export beside it: export.json's ``int4.quality``.

- ``greedy``: both files generate greedily from the same eval prompts (the first
  ``PROMPTS`` parity rows, up to ``decoder_graph.PROMPT_TOKENS`` tokens each, ``NEW_TOKENS``
  new tokens, the model's generation config without sampling or beams); the share of new
  tokens equal position by position, the prompts generated identically, and where each first
  differs (new-token index; null: never).
- ``perplexity``: each file's teacher-forced perplexity on the parity rows (eval data where the
  run has it): exp of the mean negative log-likelihood of every real next token (the labels'
  where the rows have them), and the int4 one's relative change.

Recorded, not gated: the variant's pass rule is the reduced-precision one of
``ortft.export.parity`` (teacher-forced prediction agreement and accuracy drop).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from ortft.core.constants import IGNORE_INDEX

PROMPTS, NEW_TOKENS = 8, 16
CHUNK = 8  # rows per run for the perplexity: a large vocabulary's logits stay small


def quality(
    model: Any, fp32: Path, variant: Path, feeds: dict[str, np.ndarray], cache: bool
) -> dict[str, Any]:
    """export.json's ``int4.quality`` (see the module doc); ``cache``: the graphs take their
    KV cache (``ExportOptions.kv_cache``)."""
    from ortft.export import decoder, parity

    gc = decoder.check_config(model, NEW_TOKENS)
    gc.num_beams = 1
    positions = getattr(model.config, "max_position_embeddings", None)
    sessions = [parity.session(p) for p in (fp32, variant)]
    prompts = _prompts(feeds)
    runs = [[_generate(s, p, gc, cache, positions) for p in prompts] for s in sessions]
    equal = total = identical = 0
    first: list[int | None] = []
    for want, got in zip(*runs, strict=True):
        width = max(len(want), len(got))
        a, b = (np.pad(x, (0, width - len(x)), constant_values=-1) for x in (want, got))
        same = a == b
        equal, total = equal + int(same.sum()), total + width
        identical += int(same.all())
        first.append(None if same.all() else int(np.argmin(same)))
    ppl = [_perplexity(s, feeds) for s in sessions]
    return {
        "greedy": {
            "prompts": len(prompts),
            "new_tokens": total,
            "tokens_equal": round(equal / max(total, 1), 4),
            "identical_prompts": identical,
            "first_difference": first,
        },
        "perplexity": {
            "rows": int(len(feeds["input_ids"])),
            "fp32": round(ppl[0], 4),
            "int4": round(ppl[1], 4),
            "relative_change": round(ppl[1] / ppl[0] - 1, 4),
        },
    }


def _prompts(feeds: dict[str, np.ndarray]) -> list[list[int]]:
    from ortft.families.generation.decoder_graph import PROMPT_TOKENS

    rows = zip(feeds["input_ids"][:PROMPTS], feeds["attention_mask"][:PROMPTS], strict=True)
    prompts = [[int(t) for t in ids[mask == 1][:PROMPT_TOKENS]] for ids, mask in rows]
    return [p for p in prompts if p]


def _generate(session: Any, prompt: list[int], gc: Any, cache: bool, positions: Any) -> np.ndarray:
    """The new tokens ``session`` generates greedily after ``prompt``."""
    from ortft.export import generation
    from ortft.families.generation.decoder_graph import CachedSteps, WholeSteps

    def logits(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return session.run(["logits"], {"input_ids": ids, "attention_mask": mask})[0]

    steps = CachedSteps(session) if cache else WholeSteps(logits)
    p = generation.plan(gc, len(prompt), encoder_decoder=False, max_positions=positions)
    seq, _ = generation.generate(steps, np.array([prompt], dtype=np.int64), p)
    return seq[0, len(prompt) :]


def _perplexity(session: Any, feeds: dict[str, np.ndarray]) -> float:
    """exp(mean NLL) of the real next tokens of ``feeds`` (teacher-forced, an empty past)."""
    from ortft.export import parity

    nll, count = 0.0, 0
    for start in range(0, len(feeds["input_ids"]), CHUNK):
        rows = {k: v[start : start + CHUNK] for k, v in feeds.items()}
        inputs = parity.session_feeds(
            session, {k: rows[k] for k in ("input_ids", "attention_mask")}
        )
        logits = session.run(["logits"], inputs)[0][:, :-1].astype(np.float64)
        target = rows.get("labels", rows["input_ids"])[:, 1:]
        keep = rows["attention_mask"][:, 1:].astype(bool) & (target != IGNORE_INDEX)
        top = logits.max(axis=-1, keepdims=True)
        log_z = np.log(np.exp(logits - top).sum(axis=-1)) + top[..., 0]
        picked = np.take_along_axis(logits, np.where(keep, target, 0)[..., None], -1)[..., 0]
        nll += float((log_z - picked)[keep].sum())
        count += int(keep.sum())
    return math.exp(nll / max(count, 1))
