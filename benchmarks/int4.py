"""Generated tokens/s of a decoder export's fp32 and weight-only int4 files (``--quantize int4``).

    python benchmarks/int4.py EXPORT [--new-tokens 64] [--runs 5] [--threads 1 2]
        [--out results/int4.json]

EXPORT is an ``ortft export ... --quantize int4`` folder (model.onnx with its KV cache and
model.int4.onnx). The int4 file is also written again with ``accuracy_level`` 4 (int8
activations in the MatMulNBits kernel) into a temporary folder. Each file generates
``--new-tokens`` greedy tokens (argmax, no stop: the same count for every file) after each of
four prompts, through the cache, on the given intra-op threads; the files alternate,
``--runs`` times, and the table gives the median tokens/s and the share of each file's tokens
equal to the fp32 file's, position by position. export.json's ``int4`` section has the size,
greedy agreement and perplexity change of the file the export wrote.
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

PROMPTS = ["To be, or not to be", "My lord, I", "The king doth wake", "O, what a noble mind"]


def _generate(session, prompt: list[int], new: int) -> tuple[float, list[int]]:
    """(seconds, tokens) for ``new`` greedy tokens after ``prompt`` through the cache."""
    from ortft.families.generation.decoder_graph import CachedSteps

    steps = CachedSteps(session)
    out: list[int] = []
    t0 = time.perf_counter()
    tokens = np.array([prompt], dtype=np.int64)
    for _ in range(new):
        tokens = steps(tokens).argmax(-1)[:, None]
        out.append(int(tokens[0, 0]))
    return time.perf_counter() - t0, out


def arguments() -> argparse.Namespace:
    """The command line, shared with genai_int4.py (the same prompts and counts compare)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("export", type=Path)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--out", type=Path)
    return ap.parse_args()


def main() -> None:
    args = arguments()
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from transformers import AutoTokenizer

    from ortft.export import int4, parity

    tok = AutoTokenizer.from_pretrained(args.export)
    prompts = [tok(p)["input_ids"] for p in PROMPTS]
    with tempfile.TemporaryDirectory() as tmp:
        level4 = Path(tmp) / "model.int4.acc4.onnx"
        int4.quantize(args.export / "model.onnx", level4, accuracy_level=4)
        files = {
            "fp32": args.export / "model.onnx",
            "int4": args.export / "model.int4.onnx",
            "int4, accuracy_level 4": level4,
        }
        table: dict[str, dict[str, float]] = {}
        generated: dict[str, list[list[int]]] = {}
        for threads in args.threads:
            sessions = {k: parity.session(p, threads=threads) for k, p in files.items()}
            for s in sessions.values():  # the first run allocates
                _generate(s, prompts[0], 4)
            rates: dict[str, list[float]] = {k: [] for k in files}
            for _ in range(args.runs):
                for k, s in sessions.items():
                    runs = [_generate(s, p, args.new_tokens) for p in prompts]
                    rates[k].append(len(prompts) * args.new_tokens / sum(r[0] for r in runs))
                    generated[k] = [r[1] for r in runs]
            table[f"{threads} thread(s)"] = {
                k: round(statistics.median(v), 1) for k, v in rates.items()
            }
        sizes = {k: parity.dir_bytes(p.parent, p.name) for k, p in files.items()}
    equal = {  # position by position, against the fp32 file's tokens
        k: float(np.mean(np.array(v) == np.array(generated["fp32"]))) for k, v in generated.items()
    }
    report = json.loads((args.export / "export.json").read_text())
    result = {
        "tokens_per_s": table,
        "tokens_equal_to_fp32": equal,
        "bytes": sizes,
        "int4": report.get("int4"),
    }
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
