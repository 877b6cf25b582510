"""``ortft bench``: the same recipe on several backends, side by side, each run in its own process.

Every run is ``python -m ortft train RECIPE backend.name=... training.max_steps=N ...`` in a fresh
process (no export, no checkpoints, no eval, a metrics row per step), run in alternation
(A B A B ... for ``--repeats``) so that drift in a shared machine's load hits every backend alike.
The baseline is ``torch``: what a PyTorch user would run (sdpa attention, fused AdamW); every
ratio is against it, taken as the median of the per-repeat ratios (each pair ran back to back).

A backend entry is a ``backend.name`` value or a bench-only variant, optionally followed by
``+key=value`` settings (``bench_variants.py`` parses them): a dotted recipe key (``ort+backend.compute_optimizer=false``)
or an ``ORTFT_*`` / ``ORTMODULE_*`` / ``OMP_*`` / ``GOMP_*`` / ``MKL_*`` environment variable
(``ort+ORTFT_ORT_SPINNING=1``, ``ort+ORTMODULE_ENABLE_EMBEDDING_SPARSE_OPTIMIZER=0``).
That is how the speed levers are measured against each other in one run.

Tokens and FLOPs come from the shapes each step ran (its metrics row: real tokens, padded
tokens, each micro-batch's length): tokens/s counts real tokens, MFU counts matmul FLOPs
(``ortft.tools.flops``) for the real tokens (useful work) and the padded shapes (what ran) over
the fp32 square's rate, and "of limit" over the rate measured at the model's own GEMMs in the
route's dtype (``ortft.tools.limit``). An MFU above 100% is reported as it is, with a warning.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ortft.core.errors import RecipeError, UsageError
from ortft.run.summary import BackendReport, RunSummary
from ortft.tools import flops, limit, processes
from ortft.tools.bench_report import plot, print_table
from ortft.tools.bench_variants import OPTIONAL, Variant, parse_variants

__all__ = ["parse_variants", "plot", "print_table", "run"]

log = logging.getLogger("ortft")

BASELINE = "torch"
# What makes a training run a measurement: no export, checkpoints or eval; a row per step.
BENCH_OVERRIDES = {
    "export.enabled": "false",
    "checkpoint.save_every": "null",
    "checkpoint.resume": "never",
    "data.eval": "null",
    "data.eval_fraction": "0",
    "training.eval_every": "null",
    "training.log_every": "1",
}


@dataclass
class RunResult:
    label: str
    repeat: int
    ok: bool
    error: str | None = None
    step_times: list[float] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)  # metrics.jsonl train rows
    out_dir: Path | None = None  # the run's folder (gone when the bench ends)
    first_step_s: float | None = None
    loss: float | None = None
    rss_mb: float | None = None
    wall_s: float = 0.0
    summary: RunSummary = field(default_factory=RunSummary)


def _overrides(variant: Variant, steps: int) -> list[str]:
    merged = {**BENCH_OVERRIDES, "training.max_steps": str(steps), **variant.overrides}
    return [f"{k}={v}" for k, v in merged.items()]


def _run_one(
    recipe: Path, variant: Variant, steps: int, repeat: int, timeout: float, workdir: Path
) -> RunResult:
    out_dir = workdir / f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', variant.label)}-{repeat}"
    cmd = [
        sys.executable,
        "-m",
        "ortft",
        "train",
        str(recipe),
        *_overrides(variant, steps),
        "--output-dir",
        str(out_dir),
        "--json",
    ]
    env = {**os.environ, **variant.env, "NO_COLOR": "1"}
    stdout_path, stderr_path = out_dir.with_suffix(".out"), out_dir.with_suffix(".err")
    t0 = time.perf_counter()
    with open(stdout_path, "w") as out, open(stderr_path, "w") as err:
        returncode, peak_mb = processes.run_to_end(cmd, env, out, err, timeout)
    res = RunResult(
        variant.label,
        repeat,
        ok=False,
        wall_s=time.perf_counter() - t0,
        rss_mb=peak_mb,
    )
    if returncode != 0:
        tail = [ln for ln in stderr_path.read_text(errors="replace").splitlines() if ln.strip()]
        why = "timed out" if returncode == -9 else f"exit {returncode}"
        res.error = f"{why}: {tail[-1][:300] if tail else 'no output'}"
        return res
    summary = RunSummary.from_dict(json.loads(stdout_path.read_text()))  # `ortft train --json`
    rows = [json.loads(ln) for ln in (out_dir / "metrics.jsonl").read_text().splitlines()]
    res.rows = [r for r in rows if r["kind"] == "train"]
    res.step_times = [r["step_time_s"] for r in res.rows]
    res.out_dir = out_dir
    res.first_step_s = summary.throughput["first_step_s"]
    res.loss = summary.metrics["train_loss"]
    res.summary = summary
    res.ok = True
    return res


def machine() -> dict[str, Any]:
    """The CPU model, cores, platform and Python a bench ran on (benchmarks/ records it too)."""
    return {
        "cpu": limit.cpu_model(),
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def _load_avg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _check_counts(steps: int, warmup: int, repeats: int, limit_mode: str) -> None:
    limit.check_mode(limit_mode)
    if steps <= warmup:
        raise UsageError(f"--steps ({steps}) must be larger than --warmup ({warmup})")
    if repeats < 1 or warmup < 1:
        raise UsageError(
            "--repeats and --warmup must be at least 1 (the first step holds ORT's export)"
        )


def _load_all(recipe: Path, variants: list[Variant], steps: int) -> dict[str, Any]:
    """Every variant's recipe, validated here so that a typo, or a backend this install cannot
    train with, is exit 2 before anything runs."""
    from ortft.recipe import io as recipe_io
    from ortft.recipe.backends import check_installed

    loaded = {v.label: recipe_io.load(recipe, _overrides(v, steps)) for v in variants}
    for label, one in loaded.items():
        try:
            check_installed(one.recipe)
        except RecipeError as err:
            raise UsageError(f"--backends {label}: {err}") from None
    return loaded


def run(
    recipe: Path,
    backends: str | None,
    steps: int,
    warmup: int,
    repeats: int,
    timeout: float = 900.0,
    limit_mode: str = "cached",
) -> dict[str, Any]:
    """``ortft bench``: every variant's runs, alternating, and the JSON the command prints."""
    _check_counts(steps, warmup, repeats, limit_mode)
    variants = parse_variants(backends)
    loaded = _load_all(recipe, variants, steps)
    r = next(iter(loaded.values())).recipe
    import torch

    cuda = r.hardware.device != "cpu" and torch.cuda.is_available()
    threads = r.hardware.threads or (os.cpu_count() or 1)
    peak = flops.measure_peak_flops("cuda" if cuda else "cpu", threads)
    log.info(
        "bench: %s, %d steps (first %d not timed) × %d repeat(s) of %s; peak %.1f GFLOP/s",
        recipe,
        steps,
        warmup,
        repeats,
        ", ".join(v.label for v in variants),
        peak["flops"] / 1e9,
    )
    load_before = _load_avg()
    with tempfile.TemporaryDirectory(prefix="ortft-bench-") as tmp:
        runs = _run_all(recipe, variants, steps, warmup, repeats, timeout, Path(tmp))
        flop_model = _flop_model(runs, r)  # from a run's final/config.json, before it is gone
        measured = limit.from_runs(runs, r, warmup, flop_model, peak["device"], threads, limit_mode)
    peak_samples = _peak_again(peak, threads)
    results = {
        v.label: _aggregate(
            v,
            [x for x in runs if x.label == v.label],
            warmup,
            loaded[v.label].recipe.training.batch_size,  # rows per micro-batch (a variant's own)
            flop_model,
            peak["flops"],
        )
        for v in variants
    }
    _add_ratios(results, runs, warmup)
    limit.add_shares(results, measured)
    return {
        "format_version": 2,  # 2: tokens, padding and MFU from the shapes each step ran
        "recipe": str(recipe),
        "steps": steps,
        "warmup": warmup,
        "repeats": repeats,
        "baseline": BASELINE,
        "batch": _batch(r),
        "machine": {
            **machine(),
            "device": peak["device"],
            "threads": threads,
            "load_avg_before": load_before,
            "load_avg_after": _load_avg(),
        },
        "peak": {
            "flops": peak["flops"],
            "before_after": peak_samples,
            "by_library": peak["by_library"],
            "how": peak["how"] + "; the better of before and after the runs",
        },
        "flop_model": flop_model.as_dict() if flop_model else None,
        "mfu_formula": MFU_FORMULA,
        **limit.report(measured),
        "throughput_formula": "totals over the timed steps of every repeat / their total time "
        "(batch lengths vary with data.padding, so a median step is no batch's throughput)",
        "ratio_formula": "median over repeats of (baseline median step time / this median step "
        "time), each pair run back to back: > 1 is faster than the baseline",
        "backends": results,
        "warnings": _warnings(results),
        "failed": _failed(results),
    }


def _failed(results: dict[str, Any]) -> list[str]:
    """The variants that failed every run (an optional one is skipped, not failed)."""
    return [
        lbl
        for lbl, res in results.items()
        if res["status"] == "failed" and lbl.split("+")[0] not in OPTIONAL
    ]


def _peak_again(peak: dict[str, Any], threads: int) -> list[float]:
    """Measure the peak again (load drifts), keep the better in ``peak``; the two samples."""
    after = flops.measure_peak_flops(peak["device"], threads)
    samples = [peak["flops"], after["flops"]]
    peak["flops"] = max(samples)
    peak["by_library"] = {k: max(v, after["by_library"][k]) for k, v in peak["by_library"].items()}
    return samples


def _batch(recipe: Any) -> dict[str, Any]:
    """What each step of the bench's runs trains on: rows per optimizer step, lengths, padding."""
    t, d = recipe.training, recipe.data
    return {
        "samples_per_step": t.batch_size * t.gradient_accumulation_steps,
        "max_length": d.max_length,
        "padding": d.padding,
        "pad_to_multiple_of": d.pad_to_multiple_of,
        "group_by_length": d.group_by_length,
    }


MFU_FORMULA = (
    "matmul FLOPs of the timed steps / their total time / peak. FLOPs per step: 3 × forward "
    "(forward + backward), forward = Σ over micro-batches of 2 × matmul weights per position × "
    "rows × length + 2 × per-row head weights × rows + 4 × layers × attention width × rows × "
    "length² (embedding tables are lookups: not counted). mfu: each row at its real length "
    "(useful work); mfu_padded: at the batch's padded length (what the hardware ran)"
)


def _run_all(
    recipe: Path,
    variants: list[Variant],
    steps: int,
    warmup: int,
    repeats: int,
    timeout: float,
    tmp: Path,
) -> list[RunResult]:
    """Every variant, ``repeats`` times, alternating (A B A B ...)."""
    runs: list[RunResult] = []
    for rep in range(repeats):
        for v in variants:
            res = _run_one(recipe, v, steps, rep, timeout, tmp)
            runs.append(res)
            if res.ok:
                log.info(
                    "bench: %-20s repeat %d: %.1f ms/step, first step %.2f s, loss %.4f",
                    v.label,
                    rep + 1,
                    statistics.median(res.step_times[warmup:]) * 1000,
                    res.first_step_s,
                    res.loss,
                )
            else:
                log.warning("bench: %s repeat %d failed: %s", v.label, rep + 1, res.error)
    return runs


def _flop_model(runs: list[RunResult], recipe: Any) -> flops.FlopModel | None:
    """The FLOP model of the model the runs trained (read from the first good run's final/)."""
    from ortft import tasks

    done = next((x for x in runs if x.ok and x.out_dir and (x.out_dir / "final").is_dir()), None)
    if done is None or done.out_dir is None:
        return None
    try:
        auto_class = tasks.get(recipe.task.name, recipe.task).auto_class
        lora = recipe.adapter is not None  # a frozen base: no weight gradients
        return flops.from_saved(done.out_dir / "final", auto_class, recipe.task.name, lora)
    except Exception as err:  # noqa: BLE001 - no MFU is no reason to lose the timings
        log.warning("bench: no MFU (cannot count the model's FLOPs: %s)", err)
        return None


def _work(
    rows: list[dict[str, Any]], rows_per_micro: int, flop_model: flops.FlopModel | None
) -> dict[str, float]:
    """Real and padded tokens, rows, and useful and hardware FLOPs of these metrics rows (each
    holds its step's shapes: real tokens, Σ row length², each micro-batch's length)."""
    rows_of = [rows_per_micro * len(r["batch_lengths"]) for r in rows]
    out = {
        "tokens": float(sum(r["tokens"] for r in rows)),
        "padded_tokens": float(sum(r["padded_tokens"] for r in rows)),
        "rows": float(sum(rows_of)),
    }
    if flop_model is not None:
        out["useful_flops"] = sum(
            flop_model.useful(n, r["tokens"], r["tokens_sq"])
            for n, r in zip(rows_of, rows, strict=True)
        )
        out["hardware_flops"] = sum(
            flop_model.hardware(rows_per_micro, r["batch_lengths"]) for r in rows
        )
    return out


def _aggregate(
    v: Variant,
    runs: list[RunResult],
    warmup: int,
    rows_per_micro: int,
    flop_model: flops.FlopModel | None,
    peak: float,
) -> dict[str, Any]:
    good = [x for x in runs if x.ok]
    out: dict[str, Any] = {"overrides": v.overrides, "env": v.env, "runs": len(runs)}
    if not good:
        status = "skipped" if v.label.split("+")[0] in OPTIONAL else "failed"
        return {**out, "status": status, "error": runs[0].error if runs else "not run"}
    timed = [row for x in good for row in x.rows[warmup:]]
    steady = [row["step_time_s"] for row in timed]
    med, total = statistics.median(steady), sum(steady)
    work = _work(timed, rows_per_micro, flop_model)
    s0 = good[0].summary
    b = s0.backend or BackendReport(requested=v.label, used="?")
    dtype = s0.precision.dtype if s0.precision else "fp32"  # ort-ondevice: fp32, unreported
    mfu = work["useful_flops"] / total / peak if flop_model else None
    mfu_padded = work["hardware_flops"] / total / peak if flop_model else None
    return {
        **out,
        "status": "ok" if len(good) == len(runs) else "partial",
        "error": next((x.error for x in runs if not x.ok), None),
        "backend_used": b.used,
        "fallback": b.fallback,
        "notes": b.notes,
        "pytorch_kernels": b.pytorch_kernels,
        "ort_exports": max(x.summary.backend.ort_exports if x.summary.backend else 0 for x in good),
        "first_step_s": statistics.median(x.first_step_s or 0.0 for x in good),
        "step_s": {"median": med, "min": min(steady), "max": max(steady)},
        "timed_steps": len(steady),
        "timed_s": total,
        "samples_per_s": work["rows"] / total,
        "tokens_per_s": work["tokens"] / total,  # real (non-padding) tokens
        "padded_tokens_per_s": work["padded_tokens"] / total,
        "padding_fraction": 1 - work["tokens"] / work["padded_tokens"],
        "mean_batch_length": work["padded_tokens"] / work["rows"],
        "peak_rss_mb": max(x.rss_mb or 0.0 for x in good),
        "loss": good[0].loss,
        "losses": [x.loss for x in good],
        "parameters": s0.parameters or None,
        "mfu": mfu,  # useful work: each row at its real length
        "mfu_padded": mfu_padded,  # hardware work: the padded shapes that ran
        # not clamped: above 100% the peak or the FLOP count is wrong, not the run that fast
        "mfu_above_100": any(m is not None and m > 1 for m in (mfu, mfu_padded)),
        "dtype": dtype,
        "flops_per_s": work["useful_flops"] / total if flop_model else None,
        "flops_per_s_padded": work["hardware_flops"] / total if flop_model else None,
        "per_repeat_median_step_s": [statistics.median(x.step_times[warmup:]) for x in good],
    }


def _warnings(results: dict[str, Any]) -> list[str]:
    return [
        f"{label}: MFU {r['mfu']:.1%} (padded {r['mfu_padded']:.1%}) is above 100%: a "
        "measurement problem, not a speed (the peak was measured on a busier machine than "
        "the run, or the FLOP count is too high)"
        for label, r in results.items()
        if r.get("mfu_above_100")
    ]


def _add_ratios(results: dict[str, Any], runs: list[RunResult], warmup: int) -> None:
    base = results.get(BASELINE)
    base_runs = {x.repeat: x for x in runs if x.label == BASELINE and x.ok}
    for label, res in results.items():
        if "step_s" not in res or not base_runs:
            res["ratio_vs_torch"] = None
            continue
        ratios = [
            statistics.median(base_runs[x.repeat].step_times[warmup:])
            / statistics.median(x.step_times[warmup:])
            for x in runs
            if x.label == label and x.ok and x.repeat in base_runs
        ]
        res["ratio_vs_torch"] = statistics.median(ratios) if ratios else None
        res["ratios_per_repeat"] = ratios
        if base and base.get("loss") is not None and res.get("loss") is not None:
            res["loss_diff_vs_torch"] = res["loss"] - base["loss"]
