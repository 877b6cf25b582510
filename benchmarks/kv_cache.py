"""Generated tokens/s of an exported decoder, with and without its KV cache.

    python benchmarks/kv_cache.py [--new-tokens 64] [--runs 5] [--out results/kv_cache.json]

A GPT-2 built from a config (4 layers, hidden 256, 4 heads, 512 positions, random weights; no
download) is exported twice with ``ortft.export.exporter.export_model``: the default graph with
the cache and the ``kv_cache=False`` graph. Each then generates ``--new-tokens`` greedy tokens
after a 16-token prompt, on one intra-op thread: with the cache through ``parity.greedy`` (the
loop ``ortft predict`` runs), without it by re-running the whole sequence per token. The two
alternate, ``--runs`` times; the table gives the median tokens/s of each.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

PROMPT = 16


def _model_and_tokenizer():
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from ortft.backends.torch.models import train_tokenizer
    from ortft.recipe.schema import TrainTokenizer

    words = [
        "the",
        "cat",
        "sat",
        "on",
        "a",
        "mat",
        "while",
        "dogs",
        "ran",
        "over",
        "trees",
        "in",
        "parks",
        "and",
        "birds",
        "sang",
    ]
    tok = train_tokenizer([" ".join(words[i:] + words[:i]) for i in range(len(words))] * 20,
                          TrainTokenizer(kind="byte-bpe", vocab_size=400))  # fmt: skip
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=len(tok), n_embd=256, n_layer=4, n_head=4, n_positions=512)
    return GPT2LMHeadModel(config).eval(), tok


def _whole(sess, prompt: list[int], steps: int) -> int:
    ids = list(prompt)
    for _ in range(steps):
        x = np.asarray([ids], dtype=np.int64)
        ids.append(
            int(
                sess.run(["logits"], {"input_ids": x, "attention_mask": np.ones_like(x)})[0][
                    0, -1
                ].argmax()
            )
        )
    return len(ids) - len(prompt)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    from ortft.export import exporter, parity

    model, tok = _model_and_tokenizer()
    tmp = Path(tempfile.mkdtemp())
    sessions = {}
    for name, cache in (("with cache", True), ("without cache", False)):
        report = exporter.export_model(
            model, tok, "causal-lm", tmp / name.replace(" ", "-"), opset=20, tolerance=1e-4,
            options=exporter.ExportOptions(kv_cache=cache),
        )  # fmt: skip
        assert report["passed"], report["failures"]
        sessions[name] = parity.session(Path(report["model"]), threads=1)
    prompt = np.random.default_rng(0).integers(0, len(tok), PROMPT).tolist()
    rates: dict[str, list[float]] = {k: [] for k in sessions}
    for _ in range(args.runs + 1):  # the first round warms up (allocations), not counted
        for name, sess in sessions.items():
            t0 = time.perf_counter()
            if name == "with cache":
                n = len(parity.greedy(sess, prompt, args.new_tokens)[0])
            else:
                n = _whole(sess, prompt, args.new_tokens)
            rates[name].append(n / (time.perf_counter() - t0))
    result = {
        "model": "GPT-2 from config: 4 layers, hidden 256, 4 heads (random weights)",
        "prompt_tokens": PROMPT,
        "new_tokens": args.new_tokens,
        "threads": 1,
        "runs": args.runs,
        "tokens_per_s": {k: round(statistics.median(v[1:]), 1) for k, v in rates.items()},
        "all_runs": {k: [round(x, 1) for x in v[1:]] for k, v in rates.items()},
    }
    t = result["tokens_per_s"]
    result["speedup"] = round(t["with cache"] / t["without cache"], 2)
    print(
        f"{'graph':<15} tokens/s (median of {args.runs}, {args.new_tokens} new tokens)",
        file=sys.stderr,
    )
    for k, v in t.items():
        print(f"{k:<15} {v}", file=sys.stderr)
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
