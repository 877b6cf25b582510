"""ortft's step at two checkouts, alternating: what a change did to the peer benches' fine-tunes.

Run (not in CI; a quiet machine), with the older commit checked out beside the repository:

    git worktree add /tmp/before <commit>
    .venv-current/bin/python benchmarks/ab_commits.py --before /tmp/before --pairs 4 \\
        --tasks sentence,text-short --out benchmarks/results/ab-commits.json

The tasks are ``dropout_masks.py``'s (``text-short``, ``text-long``, ``sentence``: the peer
benches' own fine-tunes and overrides, torch bf16, 24 steps, no eval, export or checkpoint),
here with ``precision.weights=bf16``, the route ``auto`` runs there on a bf16-capable CPU
(``--weights fp32``: bf16 autocast over fp32 weights). Each pair runs ``after``, the checkout
this Python has installed, then ``before``, with ``--before`` first on PYTHONPATH; each a fresh
process as the peer benches start one, from a folder outside the repository, so that ``python
-m ortft`` imports the checkout meant, not the working directory's. A run's figure is its
median step over steps 5-24 (metrics.jsonl's ``time_s``). Prints each pair and its ratio
before / after (above 1: the later checkout is faster), then their median.
"""

from __future__ import annotations

import argparse
import functools
import importlib.metadata
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import dropout_masks
import peer_common as common  # benchmarks/: the script's folder is on sys.path

SIDES = ("after", "before")


def imported_from(cwd: str) -> str:
    """The folder ``python -m ortft`` imports ortft from, in this environment and ``cwd``."""
    code = "import ortft, pathlib; print(pathlib.Path(ortft.__file__).parent.parent)"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def first_on_path(before: Path) -> dict[str, str]:
    """The environment update that puts ``before`` first on PYTHONPATH."""
    paths = [str(before), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {"PYTHONPATH": os.pathsep.join(paths)}


def one_run(
    before: Path, recipe: Path, settings: dict[str, str], side: str, out: Path
) -> dict[str, Any]:
    """``dropout_masks.one_run`` (masks as the recipe says) of ``side``'s checkout."""
    with common.environ(**(first_on_path(before) if side == "before" else {})):
        return dropout_masks.one_run(recipe, settings, "auto", out)


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--before", type=Path, required=True, help="the older checkout's folder")
    p.add_argument("--pairs", type=int, default=4)
    p.add_argument("--tasks", default="text-short,sentence")
    p.add_argument("--weights", choices=("bf16", "fp32"), default="bf16")
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args()
    before, out = a.before.resolve(), a.out.resolve() if a.out else None
    outside = tempfile.mkdtemp(prefix="ab-commits-")
    os.chdir(outside)  # ``python -m`` puts the working folder first on sys.path
    with common.environ(**first_on_path(before)):
        sources = {"before": imported_from(outside)}
    sources["after"] = imported_from(outside)
    if sources["after"] == sources["before"] or sources["before"] != str(before):
        raise SystemExit(f"ab_commits: both sides would not run the checkouts meant: {sources}")
    print(f"ab_commits: after = {sources['after']}, before = {sources['before']}", flush=True)
    result: dict[str, Any] = {
        "machine": common.cpu(),
        "torch": importlib.metadata.version("torch"),
        "steps": dropout_masks.STEPS,
        "weights": a.weights,
        "checkouts": sources,
        "tasks": {},
    }
    for task in a.tasks.split(","):
        recipe, settings = dropout_masks.overrides(task)
        settings = {**settings, "precision.weights": a.weights}
        result["tasks"][task] = common.ab_pairs(
            "ab_commits", task, SIDES, functools.partial(one_run, before, recipe, settings), a.pairs
        )
    if out:
        common.write_json(out, result)


if __name__ == "__main__":
    main()
