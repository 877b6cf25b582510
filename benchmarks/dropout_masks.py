"""``backend.dropout_masks``: the same run with 16-bit masks and with torch's, alternating.

Run (not in CI; a quiet machine; the profile whose torch is measured):

    .venv-current/bin/python benchmarks/dropout_masks.py --pairs 3 \\
        --out benchmarks/results/dropout-masks-current.json

Three of the peer benches' ortft fine-tunes, torch backend, bf16, 24 steps, no eval, export or
checkpoint, each with the bench's own overrides:

- ``text-short``: ``peer.py``'s MiniLM on Rotten Tomatoes snippets (batch 16, dropout 0.1);
- ``text-long``: the same on BBC news at 128 tokens;
- ``sentence``: ``peer_sentence.py``'s all-MiniLM-L6-v2 with MNRL (32 pairs of 64 tokens).

Each pair runs ``backend.dropout_masks=int16`` then ``torch``, each a fresh process as
peer_common runs one (offline; its peak RSS and the share of the CPU others took); a run's figure
is the median step time over steps 5-24 (metrics.jsonl's ``time_s``). Prints each pair, the
ratio torch / int16 per pair (above 1: the 16-bit masks are faster) and their median.
"""

from __future__ import annotations

import argparse
import functools
import importlib.metadata
import os
from pathlib import Path
from typing import Any

import peer
import peer_common as common  # benchmarks/: the script's folder is on sys.path
import peer_sentence

STEPS, WARM = 24, 4
TIMEOUT = 900.0  # seconds a run may take
SETTINGS = ("int16", "torch")


def overrides(task: str) -> tuple[Path, dict[str, str]]:
    """The recipe and its overrides for ``task``: the bench's, on the torch bf16 route."""
    route = {"backend.name": "torch", "precision.dtype": "bf16", "training.max_steps": str(STEPS)}
    if task == "sentence":
        return peer_sentence.RECIPE, {**peer_sentence.ORTFT_OVERRIDES, **route}
    kind = task.removeprefix("text-")
    return peer.RECIPE, {**peer.ORTFT_OVERRIDES, **peer.KIND_OVERRIDES[kind], **route}


def one_run(recipe: Path, settings: dict[str, str], masks: str, out: Path) -> dict[str, Any]:
    """One ``ortft train`` in a fresh process: its median timed step and dropout record."""
    overrides = {**settings, "backend.dropout_masks": masks}
    summary, train, shared = common.ortft_run(
        f"dropout_masks {masks}", recipe, overrides, out, TIMEOUT
    )
    timing = common.timing([r["time_s"] for r in train], STEPS - WARM, WARM, 1)
    return {
        "ms_per_step": timing["ms_per_step"],
        "dropout_masks": summary["backend"]["dropout_masks"],
        "losses": [r["loss"] for r in train][:3],
        **shared,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--tasks", default="text-short,text-long,sentence")
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the peer benches
    result: dict[str, Any] = {
        "machine": common.cpu(),
        "torch": importlib.metadata.version("torch"),
        "steps": STEPS,
        "tasks": {},
    }
    for task in a.tasks.split(","):
        recipe, settings = overrides(task)
        result["tasks"][task] = common.ab_pairs(
            "dropout_masks",
            task,
            SETTINGS,
            functools.partial(one_run, recipe, settings),
            a.pairs,
        )
    if a.out:
        common.write_json(a.out, result)


if __name__ == "__main__":
    main()
