"""This machine's measured matmul limit at the bench recipes' GEMM shapes, fp32 and bf16.

For each recipe, the projection GEMMs of one transformer layer's training step (forward, input
gradient, weight gradient; ``ortft.tools.limit``) at its hidden and feed-forward widths for a
micro-batch of ``batch_size × max_length`` tokens, and the 2048³ square, timed with torch on the
threads ``ortft bench`` runs with. ``ortft bench`` measures (or reads from the cache) the same
thing at the lengths its steps ran and reports each route's share of it; this script gives the
limit alone. Results are cached under ``${ORTFT_CACHE:-~/.cache/ortft}/limit``; ``--refresh``
measures again and keeps the better rate.

Run (not in CI; under a minute on 2 quiet cores):

    python benchmarks/limit.py --refresh --out benchmarks/results/limit.json
    python benchmarks/limit.py --shape vit-digits=192,768,2080   # hidden,intermediate,tokens
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from ortft.recipe import io as recipe_io
from ortft.tools import limit
from ortft.tools.bench import machine

ROOT = Path(__file__).resolve().parent.parent
TEXT = ("bert-cls", "minilm-news", "gpt2-clm")  # the CPU bench recipes with a max_length


def shapes(args: argparse.Namespace) -> dict[str, tuple[int, int, int]]:
    out = {}
    for name in args.recipes:
        loaded = recipe_io.load(ROOT / "recipes" / "bench" / f"{name}.yaml")
        out[name] = limit.recipe_shape(loaded)
    for spec in args.shape:
        name, _, dims = spec.partition("=")
        try:
            hidden, inner, tokens = (int(x) for x in dims.split(","))
        except ValueError:
            sys.exit(f"error: --shape {spec!r}: expected NAME=HIDDEN,INTERMEDIATE,TOKENS")
        out[name] = (hidden, inner, tokens)
    return out


def markdown(rows: dict[str, dict]) -> str:
    lines = [
        "| shapes | hidden, ffn, tokens | fp32 GFLOP/s | bf16 GFLOP/s |",
        "|---|---|---|---|",
    ]
    for name, r in rows.items():
        d = r["dtypes"]
        lines.append(
            f"| {name} | {r['hidden']}, {r['intermediate']}, {r['tokens']} | "
            f"{d['fp32']['flops'] / 1e9:.0f} | {d['bf16']['flops'] / 1e9:.0f} |"
        )
    first = next(iter(rows.values()))
    sq = {k: v["square_flops"] / 1e9 for k, v in first["dtypes"].items()}
    lines.append(f"| {first['square']}³ square | | {sq['fp32']:.0f} | {sq['bf16']:.0f} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--recipes", nargs="*", default=list(TEXT), help="recipes/bench/ names")
    p.add_argument("--shape", action="append", default=[], help="NAME=HIDDEN,INTERMEDIATE,TOKENS")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--refresh", action="store_true", help="measure again, keep the better")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    load_before = os.getloadavg()
    rows = {}
    for name, (hidden, inner, tokens) in shapes(args).items():
        gemms = limit.layer_gemms(hidden, inner, tokens)
        r = limit.measure(gemms, "cpu", args.threads, repeats=args.repeats, refresh=args.refresh)
        rows[name] = {**r, "hidden": hidden, "intermediate": inner, "tokens": tokens}
    result = {
        "machine": {**machine(), "load_avg_before": load_before, "load_avg_after": os.getloadavg()},
        "limits": rows,
    }
    print(markdown(rows))
    print(f"{result['machine']['cpu']}, {args.threads} threads, bf16 units: "
          f"{next(iter(rows.values()))['bf16_units']}, load {load_before} → "
          f"{result['machine']['load_avg_after']}", file=sys.stderr)  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
