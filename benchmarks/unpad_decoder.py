"""``backend.unpad`` on a decoder: the same run unpadded and padded, alternating, fresh processes.

Run (not in CI; a quiet machine):

    python benchmarks/unpad_decoder.py --pairs 3 --out benchmarks/results/unpad-decoder.json

Two fine-tunes of the DPO peer's 25M GPT-2 (``peer_dpo.build_model``: n_embd 512, 8 layers,
built from a config, seeded), torch backend, bf16, 24 steps, no eval, export or checkpoint:

- ``instruction``: recipes/instruction.yaml's 300 rows with ``data.packing=false`` (each row its
  own padded row), batch 16, max_length 128;
- ``dpo``: recipes/dpo.yaml with the DPO peer's overrides (``peer_dpo.overrides``: batch 8
  pairs, 48 tokens at most).

Each pair runs ``backend.unpad=true`` then ``false``, each a fresh process as peer_common
runs one (offline, its peak RSS and the share of the CPU others took); a run's figure is the
median step time over steps 5-24 (from metrics.jsonl's ``time_s``). Prints each pair
(``true``: unpadded, ``false``: padded), the ratio padded / unpadded per pair (above 1:
unpadded is faster), their median and the share of the batches' positions that is padding
(metrics.jsonl's ``tokens`` and ``padded_tokens``).
"""

from __future__ import annotations

import argparse
import functools
import os
from pathlib import Path
from typing import Any

import peer_common as common  # benchmarks/: the script's folder is on sys.path
import peer_dpo

STEPS, WARM = 24, 4
TIMEOUT = 900.0  # seconds a run may take


def overrides(task: str, model: Path) -> tuple[Path, dict[str, str]]:
    """The recipe and its overrides for ``task``."""
    shared = {"backend.name": "torch", "precision.dtype": "bf16", "training.max_steps": str(STEPS)}
    if task == "dpo":
        return peer_dpo.RECIPE, {**peer_dpo.overrides(model), **shared}
    recipe = common.REPO / "recipes" / "instruction.yaml"
    return recipe, common.trainer_overrides(2e-3, 16, 42, **{
        "model.name_or_path": str(model),
        "model.from_config": "null",
        "model.tokenizer.train": "null",  # the model folder's tokenizer
        "data.eval": "null",
        "data.packing": "false",
        "data.max_length": "128",
        **shared,
    })  # fmt: skip


def one_run(recipe: Path, settings: dict[str, str], unpad: str, out: Path) -> dict[str, Any]:
    """One ``ortft train`` in a fresh process (peer_common's, offline): its median timed step,
    padding share, unpad record and first losses."""
    overrides = {**settings, "backend.unpad": unpad}
    summary, train, shared = common.ortft_run(
        f"unpad_decoder {unpad}", recipe, overrides, out, TIMEOUT
    )
    real, padded = sum(r["tokens"] for r in train), sum(r["padded_tokens"] for r in train)
    timing = common.timing([r["time_s"] for r in train], STEPS - WARM, WARM, 1)
    return {
        "ms_per_step": timing["ms_per_step"],
        "padding_share": 1 - real / padded,
        "unpad": summary["backend"]["unpad"],
        "losses": [r["loss"] for r in train][:3],
        **shared,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--tasks", default="instruction,dpo")
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args()
    # its recorded results ran so (as the peer benches did until 2026-12-07); both sides alike
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    peer_dpo.build_model("gpt2-25m")
    model = peer_dpo.model_dir("gpt2-25m")
    result: dict[str, Any] = {"machine": common.cpu(), "steps": STEPS, "tasks": {}}
    for task in a.tasks.split(","):
        recipe, settings = overrides(task, model)
        result["tasks"][task] = common.ab_pairs(
            "unpad_decoder",
            task,
            ("true", "false"),  # backend.unpad: unpadded first
            functools.partial(one_run, recipe, settings),
            a.pairs,
        )
        share = result["tasks"][task]["pairs"][0]["true"]["padding_share"]
        print(f"unpad_decoder: {task}: {share:.0%} of the positions padding")
    if a.out:
        common.write_json(a.out, result)


if __name__ == "__main__":
    main()
