"""What the benchmarks against transformers' Trainer (and diffusers' training loop) share
(peer_image.py, peer_speech.py, peer_sentence.py, peer_diffusion.py, peer_dpo.py and
peer_vlm.py run through ``Bench`` and ``main``; peer.py, with its routes and two kinds of data,
takes the pieces:
``trainer_overrides``, ``StepRecorder``, ``run_process``, ``ortft_result``, ``wait_quiet``).

A bench is a ``Bench``: its recipe, batch, ortft overrides and a Trainer worker (a function
that trains in its own process and writes its timing as JSON; a peer other than the Trainer
names its own two runners, ``bases``: peer_diffusion.py's diffusers and diffusers-bf16).
``main(bench)`` parses the shared flags and runs rounds of its runners (five by default), alternating
(trainer, trainer-bf16, torch, torch-bf16, ort, auto, trainer, ...), each measurement a fresh
process, each after a wait for a quiet machine; then the JSON, the table and the bench's
``report``. ``--threads N`` runs every side on N compute threads.
``StepRecorder`` gives a Trainer worker the step ends and losses it reports, timed as ortft's
side is (``timing``). ``TaskPeer`` is a task as the one peer table (peers.py) runs it: every
bench's ``task_peers()`` gives its own (``task_peer(bench, task)`` for a ``Bench``, with ortft's
``auto`` added), so the table adds no copy of a bench's runners.

A step's time is from the end of the step before to the end of this one, alike on both sides:
Trainer's ``on_step_end`` callback; ortft's metrics.jsonl ``time_s``. ms/step is the median
of the timed steps; samples/s = batch x timed steps / their time. ``peak_rss_mb``: each
measured process's own peak RSS.

Offline: HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE / HF_DATASETS_OFFLINE are set for every process.

Over 450 lines: the one harness every peer bench runs through (the bench, its rounds, the timing,
the quiet wait, the table); split, each bench's run would cross several modules.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from unittest import mock

from ortft.tools.processes import run_to_end

REPO = Path(__file__).resolve().parent.parent
BASES = ("trainer", "trainer-bf16")  # the peer's fp32 and bf16 runners: the ratios' denominators
# an ortft runner's overrides beyond the bench's own (torch-bf16: bf16 autocast, as Trainer's bf16)
# bf16 with the weights in bf16 too (fp32 master weights for the optimizer): every bench's row
BF16_WEIGHTS = {"backend.name": "torch", "precision.dtype": "bf16", "precision.weights": "bf16"}
# ortft's own pick of route, precision and weights: the probe times the others' candidates
AUTO = {"backend.name": "auto", "precision.dtype": "auto", "precision.weights": "auto"}
ORTFT_RUNNERS = {
    "torch": {"backend.name": "torch"},
    "torch-bf16": {"backend.name": "torch", "precision.dtype": "bf16"},
    "torch-bf16w": BF16_WEIGHTS,
    "ort": {"backend.name": "ort"},
    # the probe picks among the above; its steps and ORT's export come before the timed steps
    "auto": AUTO,
}
RUNNERS = (*BASES, *ORTFT_RUNNERS)
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
# A shared machine is not measured: with other work at a load average of 6 on 2 cores, a
# 2-thread torch step of peer_image's ViT took 4.0-7.7 s against 0.87 s on 1 thread (libgomp's
# workers spin-wait for a descheduled peer at every parallel region; OMP_WAIT_POLICY=PASSIVE:
# 0.72 s), and a quiet step takes 0.21 s; a bench then read ort at 3.7x the Trainer. So each
# measurement waits for a quiet second (--max-busy) and records the CPU share others took while
# it ran (``others_share``: the machine's busy time from /proc/stat less its own process tree's).
EXCEPTION = re.compile(r"^[\w.]*(Error|Exception): ")  # a traceback's last line
OTHERS = 0.1  # a run is clean where others took at most this share of the CPU
# a traceback's last line: "ImportError: cannot import ..."
EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b:?")
SUMMARIZED = ("samples_per_s", "ms_per_step", "loss_step1", "train_loss", "peak_rss_mb")


def trainer_overrides(lr: float, batch: int, seed: int, **more: str) -> dict[str, str]:
    """ortft's side of a fine-tune the Trainer runs at its defaults (linear decay, no warm-up,
    no weight decay, clipping at 1.0), restated so they follow the constants the Trainer is
    given: a metrics row per step, no eval, export or checkpoint; ``more``: the bench's own
    overrides (their dotted keys as a dict: ``**{"task.generate_samples": "0"}``)."""
    return {
        "hardware.device": "cpu",
        "training.lr": str(lr),
        "training.batch_size": str(batch),
        "training.scheduler": "linear",
        "training.warmup_ratio": "0",
        "training.weight_decay": "0",
        "training.max_grad_norm": "1.0",
        "training.seed": str(seed),
        "training.log_every": "1",  # a metrics row (with time_s) per step
        "training.eval_every": "null",
        "data.eval_fraction": "0",  # every training row, no eval
        "export.enabled": "false",
        "checkpoint.save_every": "null",
        "checkpoint.resume": "never",
        **more,
    }


def trainer_arguments(
    output_dir: str, lr: float, batch: int, steps: int, seed: int, bf16: bool, **more: object
) -> dict[str, object]:
    """The Trainer's side (any ``TrainingArguments`` subclass): its defaults but for the bench's
    constants, on CPU, no checkpoints, no trackers; ``more``: the bench's own arguments."""
    return {
        "output_dir": output_dir,
        "per_device_train_batch_size": batch,
        "learning_rate": lr,
        "max_steps": steps,
        "seed": seed,
        "bf16": bf16,
        "use_cpu": True,
        "save_strategy": "no",
        "report_to": "none",
        **more,
    }


@dataclass(frozen=True)
class Bench:
    name: str  # the log prefix, the temporary folders' and the results file's name
    script: str  # the bench's file: a Trainer runner runs it again with --worker
    recipe: Path
    batch: int
    overrides: dict[str, str]  # ortft's side of the same fine-tune, over the recipe
    model: str  # the table's headline names the model with this
    worker: Callable[[bool, int, int, Path], None]  # one Trainer run: bf16, steps, warmup, out
    extra: dict[str, Any] = field(default_factory=dict)  # JSON fields after "batch"
    extra_keys: tuple[str, ...] = ()  # more per-run fields to take the median of
    bases: tuple[str, str] = BASES  # the peer's fp32 and bf16 runners (``--worker`` runs them)
    report: Callable[[dict[str, Any]], None] | None = None  # adds its fields, prints them
    # a peer of more than two settings (peer_dpo.py's TRL): its other runners, and a worker that
    # takes the runner's name instead of ``worker``'s bf16 flag
    more_peers: tuple[str, ...] = ()
    named_worker: Callable[[str, int, int, Path], None] | None = None
    ortft_runners: dict[str, dict[str, str]] = field(default_factory=lambda: dict(ORTFT_RUNNERS))
    # fields an ortft run reports on stderr only (peer_dpo.py: the reference pass's seconds)
    ortft_stderr: Callable[[str], dict[str, Any]] | None = None
    # the useful training FLOPs of a sample and the GEMM shape of a micro-batch (``work``'s
    # dict), the same for every runner: the peer table's FLOP/s and share of the measured limit
    work: Callable[[], dict[str, Any] | None] | None = None

    @property
    def peers(self) -> tuple[str, ...]:
        return (*self.bases, *self.more_peers)


@dataclass(frozen=True)
class TaskPeer:
    """One task's rows of the one peer table (benchmarks/peers.py): the peer's settings (its
    usual one first: the fp32 it ships with; then its faster ones), ortft's routes, and how to
    measure one of them in a fresh process: ``measure(runner, steps, warmup, tmp, timeout)``
    gives ``measure``'s result (``ok``, samples/s, ``peak_rss_mb``, ``others_share`` ...)."""

    task: str
    model: str
    batch: int
    peers: tuple[str, ...]
    ortft: tuple[str, ...]
    measure: Callable[[str, int, int, Path, float], dict[str, Any]]


def task_peer(bench: Bench, task: str) -> TaskPeer:
    """``bench`` as a task of the peer table, with ortft's ``auto`` among its routes."""
    full = replace(bench, ortft_runners={**bench.ortft_runners, "auto": AUTO})

    def one(runner: str, steps: int, warmup: int, tmp: Path, timeout: float) -> dict[str, Any]:
        return measure(full, runner, steps, warmup, tmp, timeout)

    return TaskPeer(task, bench.model, bench.batch, bench.peers, tuple(full.ortft_runners), one)


# --------------------------------------------------------------------------- a Trainer's side


class StepRecorder:
    """The step ends and losses of one Trainer run: ``callback()`` for ``callbacks=``,
    ``trainer(Trainer)`` for the class to train with (it keeps each step's loss)."""

    def __init__(self) -> None:
        self.ends: list[float] = []
        self.losses: list[float] = []

    def callback(self) -> Any:
        from transformers import TrainerCallback

        ends = self.ends

        class StepEnds(TrainerCallback):
            def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                ends.append(time.perf_counter())

        return StepEnds()

    def trainer(self, base: type) -> type:
        losses = self.losses

        class LossTrainer(base):  # type: ignore[misc, valid-type]
            def training_step(self, model: Any, inputs: Any, num_items_in_batch: Any = None):
                loss = super().training_step(model, inputs, num_items_in_batch)
                losses.append(float(loss))  # a CPU scalar: no device sync to pay
                return loss

        return LossTrainer

    def result(self, steps: int, warmup: int, batch: int, run: Any, model: Any, args: Any):
        """The worker's JSON: timing, the first step's loss, what the Trainer ran with."""
        import torch

        return {
            **timing([e - self.ends[0] for e in self.ends], steps, warmup, batch),
            "loss_step1": self.losses[0],
            "loss_mean": statistics.mean(self.losses),
            "train_loss": run.training_loss,
            "threads": torch.get_num_threads(),
            "attention": model.config._attn_implementation,
            "optimizer": args.optim if isinstance(args.optim, str) else args.optim.value,
            "bf16": bool(args.bf16),
        }


def timing(ends: list[float], steps: int, warmup: int, batch: int) -> dict[str, Any]:
    """samples/s and ms/step of the timed steps, from each step's end (seconds, any origin;
    ``ends[k]`` is the end of step k + 1)."""
    timed = ends[warmup + steps - 1] - ends[warmup - 1]
    per_step = [b - a for a, b in zip(ends[warmup - 1 : -1], ends[warmup:], strict=True)]
    return {
        "samples_per_s": batch * steps / timed,
        "timed_s": timed,
        "ms_per_step": 1000 * statistics.median(per_step),
        "step_ms": [round(1000 * x, 1) for x in per_step],
    }


def alternating_ms(
    calls: dict[str, Callable[[], Any]], rounds: int, repeat: int
) -> dict[str, float]:
    """In this process, ``calls`` in turn for one untimed round and ``rounds`` timed ones of
    ``repeat`` calls each: per name, the median round's mean milliseconds a call."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds + 1):  # the first round warms up
        for name, call in calls.items():
            start = time.perf_counter()
            for _ in range(repeat):
                call()
            times[name].append((time.perf_counter() - start) / repeat * 1e3)
    return {name: statistics.median(ms[1:]) for name, ms in times.items()}


def write_json(path: Path, obj: dict[str, Any]) -> None:
    path.write_text(json.dumps(obj, indent=1))


# --------------------------------------------------------------------------- a quiet machine


def cpu_busy_s() -> float:
    """CPU seconds the whole machine has spent busy, all cores (/proc/stat: user .. steal)."""
    with open("/proc/stat") as fh:
        f = [int(x) for x in fh.readline().split()[1:9]]
    return (sum(f) - f[3] - f[4]) / os.sysconf("SC_CLK_TCK")  # less idle and iowait


def _children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def wait_quiet(max_busy: float, wait: float) -> tuple[float, float]:
    """Wait (at most ``wait`` s) until the machine is at most ``max_busy`` busy over a second
    (others' work: no measurement runs now); returns the seconds waited and the last share."""
    t0 = time.monotonic()
    while True:
        busy0 = cpu_busy_s()
        time.sleep(1.0)
        share = (cpu_busy_s() - busy0) / (os.cpu_count() or 1)
        if share <= max_busy or time.monotonic() - t0 >= wait:
            return time.monotonic() - t0, share
        time.sleep(4.0)


# --------------------------------------------------------------------------- the measurements


def measure(
    bench: Bench, runner: str, steps: int, warmup: int, tmp: Path, timeout: float, threads: int = 0
) -> dict:
    """One measurement in a fresh process: its timing and losses, or its error (``threads``: the
    compute threads of either side, 0 for their defaults)."""
    tag = f"{runner}-{len(list(tmp.iterdir()))}"
    if runner in bench.peers:
        out = tmp / f"{tag}.json"
        cmd = [sys.executable, bench.script, "--worker", runner, "--steps", str(steps),
               "--warmup", str(warmup), "--result", str(out)]  # fmt: skip
    else:
        run_dir = tmp / tag
        overrides = {
            **bench.overrides,
            **bench.ortft_runners[runner],
            "training.max_steps": str(warmup + steps),
            **({"hardware.threads": str(threads)} if threads else {}),
        }
        cmd = ortft_train(bench.recipe, overrides, run_dir)
    proc, shared = run_process(cmd, timeout, threads)
    if proc is None or proc.returncode != 0:
        return {"ok": False, **shared, "error": failure(proc, timeout)}
    flops = {"flops": bench.work()} if bench.work is not None else {}
    if runner in bench.peers:
        return {"ok": True, **shared, **json.loads(out.read_text()), **flops}
    result = ortft_result(run_dir, proc.stdout, steps, warmup, bench.batch)
    if bench.ortft_stderr is not None:
        result.update(bench.ortft_stderr(proc.stderr))
    return {"ok": True, **shared, **result, **flops}


def work(fm: Any, config: Any, samples: list[tuple[int, int, int]], batch: int) -> dict[str, Any]:
    """``work``'s dict from a FLOP model (``ortft.tools.flops``) and every sample's (rows, Σ l,
    Σ l²): a sample's mean useful training FLOPs, and the GEMMs of a micro-batch of ``batch``
    samples at the mean length (``ortft.tools.limit.layer_gemms``)."""
    from ortft.tools import limit

    useful = [fm.useful(rows, tokens, sq) for rows, tokens, sq in samples]
    mean_len = sum(t for _, t, _ in samples) / sum(r for r, _, _ in samples)
    hidden, intermediate = limit.dims(config)
    return {
        "per_sample": statistics.mean(useful),
        "hidden": hidden,
        "intermediate": intermediate,
        "tokens_per_micro": batch * round(mean_len),
    }


def ortft_train(recipe: Path, overrides: dict[str, str], run_dir: Path) -> list[str]:
    """``ortft train`` as a user runs it: the recipe, dotted overrides, ``--json``."""
    return [sys.executable, "-m", "ortft", "train", str(recipe),
            *[f"{k}={v}" for k, v in overrides.items()],
            "--output-dir", str(run_dir), "--json"]  # fmt: skip


def environ(**updates: str) -> Any:
    """This process's environment with ``updates`` set, for the processes started inside (a
    measured run inherits it: ``process_env``); as it was again after (stdlib's
    ``mock.patch.dict``, a context manager)."""
    return mock.patch.dict(os.environ, updates)


def process_env(threads: int = 0) -> dict[str, str]:
    """A measured process's environment: offline; ``threads``: the peer's torch reads
    OMP_NUM_THREADS (ortft gets hardware.threads from ``measure``)."""
    env = {**os.environ, **OFFLINE, "NO_COLOR": "1"}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def run_process(cmd: list[str], timeout: float, threads: int = 0) -> tuple[Any, dict[str, float]]:
    """Run ``cmd`` offline (``process_env``); the finished process (None if it timed out), its
    wall time, its peak RSS (``peak_rss_mb``: ``ortft.tools.processes``) and the share of the CPU the rest of the machine took meanwhile
    (``others_share``)."""
    env = process_env(threads)
    t0, busy0, own0 = time.perf_counter(), cpu_busy_s(), _children_cpu_s()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        code, peak_mb = run_to_end(cmd, env, out, err, timeout)
        out.seek(0)
        err.seek(0)
        proc = subprocess.CompletedProcess(cmd, code, out.read(), err.read())
    wall = time.perf_counter() - t0
    if wall >= timeout and code < 0:
        proc = None
    others = (cpu_busy_s() - busy0) - (_children_cpu_s() - own0)
    return proc, {
        "wall_s": wall,
        "peak_rss_mb": peak_mb,
        "others_share": max(0.0, others) / (wall * (os.cpu_count() or 1)),
    }


def failure(proc: Any, timeout: float) -> str:
    """A failed process in one line: its exit code and its error (the last line that names an
    exception, with the lines a wrapped traceback continues it on; else the last line)."""
    if proc is None:
        return f"timed out after {timeout:.0f} s"
    lines = [ln.strip() for ln in proc.stderr.splitlines()]
    named = [i for i, ln in enumerate(lines) if EXCEPTION.match(ln)]
    if named:  # the exception and the lines a wrapped traceback continues it on, up to a blank
        rest = lines[named[-1] :]  # one (dynamo's "suppress_errors" hint follows a blank line)
        what = " ".join(rest[: rest.index("")] if "" in rest else rest)
    else:
        what = next((ln for ln in reversed(lines) if ln), "")
    return f"exit {proc.returncode}: {what[:300]}"


def ortft_run(
    label: str, recipe: Path, overrides: dict[str, str], out: Path, timeout: float
) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, float]]:
    """``ortft train`` in a fresh process (``run_process``: offline, its peak RSS and the share
    of the CPU others took): its summary, its training rows of metrics.jsonl and
    ``run_process``'s figures. A failed run ends the bench with one line."""
    proc, shared = run_process(ortft_train(recipe, overrides, out), timeout)
    if proc is None or proc.returncode != 0:
        raise SystemExit(f"{label}: run failed: {failure(proc, timeout)}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return json.loads(proc.stdout), [r for r in rows if r.get("kind") == "train"], shared


def ab_pairs(
    label: str,
    task: str,
    settings: tuple[str, str],
    one_run: Callable[[str, Path], dict[str, Any]],
    pairs: int,
) -> dict[str, Any]:
    """``pairs`` rounds of one run at two settings, the first first, each in its own folder
    (``one_run(setting, run_dir)`` gives its ``ms_per_step`` and ``others_share``): every pair
    and its ratio second / first (above 1: the first setting is faster), printed as each ends,
    and their median."""
    first, second = settings
    done = []
    for i in range(pairs):
        with tempfile.TemporaryDirectory(prefix=f"{label}-") as tmp:
            pair = {s: one_run(s, Path(tmp) / s) for s in settings}
        a, b = pair[first]["ms_per_step"], pair[second]["ms_per_step"]
        pair["ratio"] = b / a
        others = max(pair[s]["others_share"] for s in settings)
        print(
            f"{label}: {task} pair {i + 1}: {first} {a:.0f} ms, {second} {b:.0f} ms, "
            f"{b / a:.2f}x (others {others:.0%})",
            flush=True,
        )
        done.append(pair)
    ratios = [q["ratio"] for q in done]
    median = statistics.median(ratios)
    print(
        f"{label}: {task}: {second} / {first} median {median:.2f}x "
        f"(range {min(ratios):.2f}-{max(ratios):.2f}x, {len(ratios)} pairs)",
        flush=True,
    )
    return {"pairs": done, "median_ratio": median}


def ortft_result(run_dir: Path, stdout: str, steps: int, warmup: int, batch: int) -> dict:
    summary = json.loads(stdout)  # `ortft train --json`: the summary
    rows = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = {r["step"]: r for r in rows if r["kind"] == "train"}
    ends = [train[s]["time_s"] for s in range(1, warmup + steps + 1)]
    out = {
        **timing(ends, steps, warmup, batch),
        "loss_step1": train[1]["loss"],
        "summary_samples_per_s": summary["throughput"]["samples_per_s"],  # steps 2..N
        "train_loss": summary["metrics"]["train_loss"],
        "backend_used": summary["backend"]["used"],
        "ort_exports": summary["backend"].get("ort_exports"),
        # so a faster route is not a broken one: every step's loss, the end-of-run eval
        "loss_mean": statistics.mean(r["loss"] for r in train.values()),
        "eval_loss": summary["metrics"].get("eval_loss"),
        "eval_accuracy": summary["metrics"].get("eval_accuracy"),
        "precision": (summary.get("precision") or {}).get("dtype"),
        "weights": (summary.get("precision") or {}).get("weights", "fp32"),
        "compile": summary["backend"].get("compile"),  # backend.compile, where this ortft has it
        "probe": summary["backend"].get("probe"),  # backend.name=auto: every candidate's figures
    }
    config = run_dir / "final" / "config.json"  # a trained tokenizer's size, where it has one
    vocab = json.loads(config.read_text()).get("vocab_size") if config.exists() else None
    return {**out, "vocab_size": vocab} if vocab is not None else out


def run(bench: Bench, a: argparse.Namespace) -> dict:
    """``a.pairs`` rounds of the runners, then up to ``a.retries`` more while fewer than
    ``a.pairs`` rounds were clean (no run in them shared the CPU with others: ``clean``)."""
    rounds: list[dict[str, dict]] = []
    loads: list[float] = []
    quiet = (a.max_busy, a.wait)
    with tempfile.TemporaryDirectory(prefix=f"ortft-{bench.name}-") as tmp:
        while len(rounds) < a.pairs or (
            sum(map(clean, rounds)) < a.pairs and len(rounds) < a.pairs + a.retries
        ):
            one: dict[str, dict] = {}
            for runner in a.runners:
                waited, busy = wait_quiet(*quiet)
                loads.append(os.getloadavg()[0])
                res = measure(bench, runner, a.steps, a.warmup, Path(tmp), a.timeout, a.threads)
                res.update(load_avg_before=loads[-1], waited_s=waited, busy_before=busy)
                one[runner] = res
                what = (
                    f"{res['ms_per_step']:.0f} ms/step, {res['samples_per_s']:.1f} samples/s, "
                    f"step-1 loss {res['loss_step1']:.4f}, others "
                    f"{res['others_share']:.0%} of the CPU (waited {waited:.0f} s)"
                    if res["ok"]
                    else res["error"]
                )
                print(f"{bench.name}: round {len(rounds) + 1} {runner:14s} {what}",
                      file=sys.stderr, flush=True)  # fmt: skip
            rounds.append(one)
    kept = [r for r in rounds if clean(r)] or rounds  # all of them where none was clean
    return {
        "format_version": 1,
        "pairs": a.pairs,
        "rounds_run": len(rounds),
        "rounds_clean": sum(map(clean, rounds)),
        "rounds_summarized": "clean" if any(map(clean, rounds)) else "all (none was clean)",
        "steps": a.steps,
        "warmup": a.warmup,
        "batch": bench.batch,
        **bench.extra,
        "ortft_overrides": bench.overrides,
        "quiet": {"max_busy": quiet[0], "wait_s": quiet[1], "others_max": OTHERS},
        "threads": a.threads or "default",
        "runners": summarize(
            {r: [one[r] for one in kept] for r in a.runners}, bench.extra_keys, bench.bases
        ),
        "rounds": rounds,
        "machine": {
            **cpu(),
            "load_avg_during": [min(loads), statistics.median(loads), max(loads)],
            "load_avg_after": list(os.getloadavg()),
        },
    }


def cpu() -> dict[str, Any]:
    """The machine's CPU (``ortft bench``'s record) and its native bf16 flags: these benches rank
    routes differently on different CPUs (on 2 cores of an AMD EPYC ortft's ort trained MiniLM
    1.7x as fast as torch in fp32, ORT's GEMM being ~2x MKL's there; on 2 cores of an Intel Xeon
    with AMX it was 0.9x, peer.py 2026-12-02)."""
    from ortft.env.hardware import cpu_bf16
    from ortft.tools.bench import machine

    return {**machine(), "bf16_flags": cpu_bf16()}


def clean(one: dict[str, dict]) -> bool:
    """A round in which others took at most ``OTHERS`` of the CPU during every run that ran. A
    runner that fails by itself (torch_compile on torch 2.6) fails on a quiet machine too, and
    its share is no measure of the machine (peer.py's ``clean``): counted, no round of its bench
    was ever clean (image-text-to-text, 2026-12-06)."""
    return all(r["others_share"] <= OTHERS for r in one.values() if r["ok"])


def summarize(
    by_runner: dict[str, list[dict]], extra_keys: tuple[str, ...] = (), bases: tuple = BASES
) -> dict:
    """Per runner: the medians, and the ratio of samples/s to each base pair by pair (its median
    and min-max over the rounds where both ran)."""
    out: dict[str, Any] = {}
    for runner, runs in by_runner.items():
        row: dict[str, Any] = {key: _median_of(runs, key) for key in SUMMARIZED}
        row.update({k: v for k in extra_keys if (v := _median_of(runs, k)) is not None})
        shares = [r["others_share"] for r in runs if r["ok"]]
        row["others_share_max"] = max(shares) if shares else None
        for base in bases:
            if base not in by_runner:  # --runners left it out
                row[f"vs_{base}"] = row[f"vs_{base}_range"] = None
                continue
            ratios = [
                r["samples_per_s"] / b["samples_per_s"]
                for r, b in zip(runs, by_runner[base], strict=True)
                if r["ok"] and b["ok"]
            ]
            row[f"vs_{base}"] = statistics.median(ratios) if ratios else None
            row[f"vs_{base}_range"] = [min(ratios), max(ratios)] if ratios else None
        out[runner] = row
    return out


def best_ratio(rounds: list[dict[str, dict]], peers: tuple[str, ...]) -> dict[str, Any]:
    """Round by round, the fastest ortft runner's samples/s over the fastest of ``peers`` (a
    failed runner counts on neither side): the median, min-max, each round's figure and pair."""
    ratios, which = [], []
    for one in rounds:
        theirs = {k: v["samples_per_s"] for k, v in one.items() if k in peers and v["ok"]}
        ours = {k: v["samples_per_s"] for k, v in one.items() if k not in peers and v["ok"]}
        if theirs and ours:
            best_theirs = max(theirs, key=lambda k: theirs[k])
            best_ours = max(ours, key=lambda k: ours[k])
            ratios.append(ours[best_ours] / theirs[best_theirs])
            which.append(f"{best_ours}/{best_theirs}")
    return {
        "median": statistics.median(ratios) if ratios else None,
        "range": [min(ratios), max(ratios)] if ratios else None,
        "per_round": [round(r, 3) for r in ratios],
        "which": which,
    }


def _median_of(runs: list[dict], key: str) -> float | None:
    values = [r[key] for r in runs if r["ok"] and r.get(key) is not None]
    return statistics.median(values) if values else None


# --------------------------------------------------------------------------- the table


def _ratio(value: float | None, rng: list[float] | None) -> str:
    if value is None or rng is None:
        return f"{'—':>18s}"
    return f"{value:5.2f}× ({rng[0]:.2f}–{rng[1]:.2f})".rjust(18)


def print_table(bench: Bench, result: dict[str, Any]) -> None:
    m = result["machine"]["load_avg_during"]
    print(
        f"{bench.name}: {result['rounds_clean']} clean of {result['rounds_run']} round(s) × "
        f"{result['steps']} timed steps after {result['warmup']} warm-up, batch "
        f"{result['batch']}, {bench.model}; load average {m[0]:.1f}–"
        f"{m[2]:.1f} (median {m[1]:.1f}); the table: {result['rounds_summarized']} rounds"
    )
    fp32, bf16 = bench.bases
    print(f"{'runner':14s} {'ms/step':>8s} {'samples/s':>10s} {'vs ' + fp32:>18s} "
          f"{'vs ' + bf16:>18s} {'step-1 loss':>11s} {'others max':>10s} {'peak RSS':>9s}")  # fmt: skip
    for runner, r in result["runners"].items():
        ms, sps, loss = r["ms_per_step"], r["samples_per_s"], r["loss_step1"]
        print(
            f"{runner:14s} "
            + (f"{ms:8.0f} {sps:10.1f} " if sps is not None else f"{'failed':>19s} ")
            + _ratio(r[f"vs_{fp32}"], r[f"vs_{fp32}_range"])
            + " "
            + _ratio(r[f"vs_{bf16}"], r[f"vs_{bf16}_range"])
            + (f" {loss:11.4f}" if loss is not None else f" {'':11s}")
            + (f" {r['others_share_max']:10.0%}" if r["others_share_max"] is not None else "")
            + (f" {r['peak_rss_mb']:6.0f} MB" if r.get("peak_rss_mb") is not None else "")
        )
    runs = [x for one in result["rounds"] for x in one.values()]
    for error in sorted({x["error"] for x in runs if not x["ok"]}):
        print(f"{bench.name}: failed: {error}")
    vocabs = {x["vocab_size"] for x in runs if x["ok"] and x.get("vocab_size") is not None}
    if len(vocabs) > 1:  # each side trains its tokenizer: they should be the same one
        print(f"{bench.name}: the runners' vocabularies differ: {sorted(vocabs)} tokens")
    busy = sum(1 for x in runs if x["ok"] and x["others_share"] > OTHERS)
    if busy:
        print(
            f"{bench.name}: {busy} run(s) shared the CPU (others took over {OTHERS:.0%}): "
            "PyTorch's OpenMP threads (libgomp's default spin-wait) then run up to 4-5x "
            "slower, ORT's far less; their rounds are left out of the table where any is clean"
        )


def add_quiet_options(p: argparse.ArgumentParser) -> None:
    """--timeout, --max-busy, --wait, --retries: how a bench runs on a shared machine."""
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per measurement")
    add_wait_options(p)
    p.add_argument(
        "--retries", type=int, default=3, help="extra rounds at most while a round was not clean"
    )


def add_wait_options(p: argparse.ArgumentParser) -> None:
    """--max-busy, --wait: the wait for a quiet machine before each measurement."""
    p.add_argument(
        "--max-busy",
        type=float,
        default=0.2,
        help="wait before each measurement until other work takes at most this share of the CPU",
    )
    p.add_argument("--wait", type=float, default=600.0, help="seconds to wait for that at most")


def main(bench: Bench, doc: str, parents: tuple[argparse.ArgumentParser, ...] = ()) -> None:
    """The command line of a bench (``doc``: its module docstring; ``parents``: the bench's own
    flags, which it has read already)."""
    names, base = (*bench.peers, *bench.ortft_runners), bench.bases[0]
    p = argparse.ArgumentParser(description=doc.split("\n")[0], parents=list(parents))
    p.add_argument("--pairs", type=int, default=5, help="rounds of the runners")
    p.add_argument("--steps", type=int, default=20, help="timed steps per measurement")
    p.add_argument("--warmup", type=int, default=4, help="untimed steps before them")
    add_quiet_options(p)
    p.add_argument(
        "--threads",
        type=int,
        default=0,
        help="compute threads of every runner (0: their defaults, all cores); 1 on a machine "
        "that others load, where 2-thread steps wait on descheduled OpenMP workers",
    )
    p.add_argument(
        "--out", type=Path, default=REPO / "benchmarks" / "results" / f"{bench.name}.json"
    )
    p.add_argument(
        "--runners",
        type=lambda s: tuple(s.split(",")),
        default=names,
        help="comma-separated, in the order each round runs them (default: all); leave out "
        "the bf16 two on a CPU without native bf16 (no avx512_bf16 / AMX: emulated, minutes a step)",
    )
    p.add_argument("--worker", choices=bench.peers, help=argparse.SUPPRESS)  # a peer's process
    p.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        if bench.named_worker is not None:
            bench.named_worker(a.worker, a.steps, a.warmup, a.result)
        else:
            bench.worker(a.worker == bench.bases[1], a.steps, a.warmup, a.result)
        return
    if a.pairs < 1 or a.steps < 1 or a.warmup < 1 or a.retries < 0 or a.threads < 0:
        p.error("--pairs, --steps and --warmup must be >= 1, --retries and --threads >= 0")
    if set(a.runners) - set(names) or base not in a.runners or len(set(a.runners)) < len(a.runners):
        p.error(f"--runners: each of {', '.join(names)} at most once, {base} among them")
    os.environ.update(OFFLINE)
    result = run(bench, a)
    print_table(bench, result)
    if bench.report is not None:
        bench.report(result)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    write_json(a.out, result)
    print(f"{bench.name}: wrote {a.out}", file=sys.stderr)
