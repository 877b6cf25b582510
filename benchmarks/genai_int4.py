"""Generated tokens/s of onnxruntime-genai on a decoder export's fp32 folder and its int4 one.

    CONSUMER_PYTHON benchmarks/genai_int4.py EXPORT [--new-tokens 64] [--runs 5]
        [--threads 1 2] [--out results/genai-int4.json]

Run it with a Python that has onnxruntime-genai (the consumer venv: scripts/consumer-env.sh
prints its python); ortft is not imported. EXPORT is an ``ortft export ... --quantize int4``
folder: genai opens EXPORT (genai_config.json: model.onnx) and EXPORT/int4 (its own
genai_config.json: model.int4.onnx), each with ``intra_op_num_threads`` set through
``og.Config.overlay``. Each generates ``--new-tokens`` greedy tokens (``min_length`` holds the
end-of-sequence token back: the same count for every folder) after each of four prompts, one
at a time, the prompt's step included in the time; the folders alternate, ``--runs`` times, and
the table gives the median tokens/s and the share of the int4 folder's tokens equal to the
fp32 one's, position by position.
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from pathlib import Path

import onnxruntime_genai as og
from int4 import PROMPTS, arguments  # benchmarks/int4.py, beside this file: stdlib and numpy


def _model(folder: Path, threads: int) -> og.Model:
    config = og.Config(str(folder))
    options = {"intra_op_num_threads": threads, "inter_op_num_threads": 1}
    config.overlay(json.dumps({"model": {"decoder": {"session_options": options}}}))
    return og.Model(config)


def _generate(model: og.Model, ids: list[int], new: int) -> tuple[float, list[int]]:
    """(seconds, tokens) for exactly ``new`` greedy tokens after ``ids``."""
    params = og.GeneratorParams(model)
    total = len(ids) + new
    params.set_search_options(max_length=total, min_length=total, do_sample=False)
    t0 = time.perf_counter()
    gen = og.Generator(model, params)
    gen.append_tokens(ids)
    while not gen.is_done():
        gen.generate_next_token()
    seconds = time.perf_counter() - t0
    tokens = [int(t) for t in gen.get_sequence(0)[len(ids) :]]
    if len(tokens) != new:
        raise SystemExit(f"genai generated {len(tokens)} tokens, not {new}")
    return seconds, tokens


def _cpu() -> str:
    """The CPU's model name (as ``lscpu`` gives it), else the machine."""
    info = Path("/proc/cpuinfo")
    lines = info.read_text().splitlines() if info.exists() else []
    names = [x.split(":", 1)[1].strip() for x in lines if x.startswith("model name")]
    return names[0] if names else platform.machine()


def main() -> None:
    args = arguments()
    int4_dir = json.loads((args.export / "export.json").read_text())["genai"]["int4"]["folder"]
    folders = {"fp32": args.export, "int4": args.export / int4_dir}
    table: dict[str, dict[str, float]] = {}
    generated: dict[str, list[list[int]]] = {}
    for threads in args.threads:
        models = {k: _model(f, threads) for k, f in folders.items()}
        prompts = [list(og.Tokenizer(models["fp32"]).encode(p)) for p in PROMPTS]
        for m in models.values():  # the first run allocates
            _generate(m, prompts[0], 4)
        rates: dict[str, list[float]] = {k: [] for k in models}
        for _ in range(args.runs):
            for k, m in models.items():
                runs = [_generate(m, p, args.new_tokens) for p in prompts]
                rates[k].append(len(prompts) * args.new_tokens / sum(r[0] for r in runs))
                generated[k] = [r[1] for r in runs]
        row = {k: round(statistics.median(v), 1) for k, v in rates.items()}
        row["int4 / fp32"] = round(row["int4"] / row["fp32"], 2)
        table[f"{threads} thread(s)"] = row
    pairs = [
        (a == b) for x, y in zip(generated["fp32"], generated["int4"], strict=True)
        for a, b in zip(x, y, strict=True)
    ]  # fmt: skip
    result = {
        "onnxruntime_genai": og.__version__,
        "cpu": _cpu(),
        "new_tokens": args.new_tokens,
        "prompts": len(PROMPTS),
        "tokens_per_s": table,
        "int4_tokens_equal_to_fp32": round(sum(pairs) / len(pairs), 4),
    }
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
