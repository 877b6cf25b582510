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

``--attention`` runs the same tasks in fp32 with the masks (``int16``) on both sides and sets the
attention against itself instead: ``eager``, which the backend picks where it draws the masks
(its ``F.dropout`` takes them), against ``sdpa`` (``ORTFT_TORCH_ATTN=sdpa``: the kernel draws
its attention dropout with torch's ``bernoulli_``), the choice before; the ratio is sdpa / eager.

``--micro`` times one dropout's forward + backward instead, in this process on 2 threads: torch's
``F.dropout`` against ``backends/torch/dropout.dropout`` on bf16 tensors the size of MiniLM's
attention probabilities ([16, 12, 128, 128]) and of a 300-row hidden state ([300, 384]): 10
alternating rounds of 5 calls each after one round's warm-up, the median round's mean.
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
ROUNDS = 10  # --micro's timed rounds


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


def attention_run(
    recipe: Path, settings: dict[str, str], attention: str, out: Path
) -> dict[str, Any]:
    """``one_run`` in fp32 with the masks drawn and ``attention`` fixed (``--attention``)."""
    with common.environ(ORTFT_TORCH_ATTN=attention):  # the child process inherits it
        return one_run(recipe, {**settings, "precision.dtype": "fp32"}, "int16", out)


def micro_shape(shape: tuple[int, ...]) -> tuple[float, float]:
    """Milliseconds a forward + backward of torch's dropout and of the 16-bit masks take on a
    bf16 tensor of ``shape``: the median over ``ROUNDS`` alternating rounds."""
    import torch

    from ortft.backends.torch import dropout

    x = torch.randn(shape, dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn(shape, dtype=torch.bfloat16)
    ms = common.alternating_ms(
        {
            "torch": lambda: torch.nn.functional.dropout(x, 0.1, True).backward(grad),
            "int16": lambda: dropout.dropout(x, 0.1).backward(grad),
        },
        ROUNDS,
        repeat=5,
    )
    return ms["torch"], ms["int16"]


def micro() -> None:
    """One dropout's forward + backward, torch's against the 16-bit masks (module docstring)."""
    import torch

    torch.set_num_threads(2)
    print(f"dropout_masks --micro: torch {torch.__version__}, p 0.1, bf16, 2 threads")
    for shape in ((16, 12, 128, 128), (300, 384)):
        own, masks = micro_shape(shape)
        print(f"  {list(shape)}: torch {own:.2f} ms, int16 {masks:.2f} ms, {own / masks:.2f}x")


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--tasks", default="text-short,text-long,sentence")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--micro", action="store_true", help="time one dropout call instead")
    p.add_argument("--attention", action="store_true", help="fp32 with the masks: eager / sdpa")
    a = p.parse_args()
    if a.micro:
        micro()
        return
    # its recorded results ran so (as the peer benches did until 2026-12-07); both sides alike
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    result: dict[str, Any] = {
        "machine": common.cpu(),
        "torch": importlib.metadata.version("torch"),
        "steps": STEPS,
        "tasks": {},
    }
    run, settings_ab = (attention_run, ("eager", "sdpa")) if a.attention else (one_run, SETTINGS)
    result["compared"] = "attention, fp32, int16 masks" if a.attention else "dropout_masks, bf16"
    for task in a.tasks.split(","):
        recipe, settings = overrides(task)
        result["tasks"][task] = common.ab_pairs(
            "dropout_masks",
            task,
            settings_ab,
            functools.partial(run, recipe, settings),
            a.pairs,
        )
    if a.out:
        common.write_json(a.out, result)


if __name__ == "__main__":
    main()
