"""``ortft bench``'s output for people: the table (stderr) and the bar chart (``--plot``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from ortft.core.errors import RunError, UsageError

COLUMNS = (
    "backend",
    "vs torch",
    "step ms",
    "min–max",
    "samples/s",
    "tokens/s",
    "pad %",
    "1st step s",
    "RSS MB",
    "loss",
    "Δloss",
    "exports",
    "MFU",
    "MFU padded",
    "of limit",
)


def _pct(value: float | None) -> str:
    """A fraction as a percentage; above 100% flagged (a measurement problem), never clamped."""
    if value is None:
        return "—"
    return f"{value * 100:.1f}%" + (" (!)" if value > 1 else "")


def _limit_caption(limit: dict[str, Any] | None) -> str:
    """The measured limit in words: each dtype's rate at the model's shapes and at the square."""
    if not limit:
        return ""
    rates = ", ".join(
        f"{k} {v['flops'] / 1e9:.0f} ({v['square_flops'] / 1e9:.0f} at {limit['square']}³)"
        for k, v in limit["dtypes"].items()
    )
    return (
        f". of limit: real tokens' FLOP/s over the measured torch matmul rate in the route's "
        f"dtype at the model's GEMMs, GFLOP/s: {rates}; bf16 units: {limit['bf16_units']}"
    )


def print_table(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    m, b = result["machine"], result["batch"]
    title = (
        f"ortft bench {result['recipe']}: {result['steps']} steps "
        f"(first {result['warmup']} untimed) × {result['repeats']}, "
        f"{b['samples_per_step']} rows/step, max_length {b['max_length']}, "
        f"padding {b['padding']}"
    )
    libs = result["peak"].get("by_library") or {}  # bench JSON before 2026-12: torch only
    per_lib = ", ".join(f"{k} {v / 1e9:.0f}" for k, v in libs.items())
    caption = (
        f"{m['cpu']}, {m['threads']} threads, load avg {m['load_avg_before']} → "
        f"{m['load_avg_after']}; peak {result['peak']['flops'] / 1e9:.0f} GFLOP/s "
        f"(measured matmul{': ' + per_lib if per_lib else ''}). tokens/s and MFU: real tokens; "
        "MFU padded: the shapes that ran" + _limit_caption(result.get("limit"))
    )
    table = Table(title=title, title_justify="left", caption=caption, caption_justify="left")
    for col in COLUMNS:
        table.add_column(col, justify="left" if col == "backend" else "right")
    for label, r in result["backends"].items():
        if "step_s" not in r:
            table.add_row(label, r["status"], (r.get("error") or "")[:80], *[""] * 12)
            continue
        s = r["step_s"]
        ratio = r.get("ratio_vs_torch")
        diff = r.get("loss_diff_vs_torch")
        table.add_row(
            label + ("" if r["status"] == "ok" else f" ({r['status']})"),
            f"{ratio:.2f}×" if ratio is not None else "—",
            f"{s['median'] * 1000:.0f}",
            f"{s['min'] * 1000:.0f}–{s['max'] * 1000:.0f}",
            f"{r['samples_per_s']:.1f}",
            f"{r['tokens_per_s']:.0f}",
            f"{r['padding_fraction'] * 100:.0f}%",
            f"{r['first_step_s']:.2f}",
            f"{r['peak_rss_mb']:.0f}",
            f"{r['loss']:.5f}",
            f"{diff:+.1e}" if diff is not None else "—",
            str(r["ort_exports"]),
            _pct(r.get("mfu")),
            _pct(r.get("mfu_padded")),
            _pct(r.get("limit_share")) + (f" {r['dtype']}" if r.get("limit_share") else ""),
        )
    # a wide table even in CI logs, where rich would otherwise assume 80 columns
    console = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 170)
    console.print(table)
    for warning in result.get("warnings", []):
        console.print(f"warning: {warning}")


def plot(result: dict[str, Any], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError("--plot needs matplotlib: pip install matplotlib") from None
    rows = [(lbl, r) for lbl, r in result["backends"].items() if "step_s" in r]
    if not rows:
        raise RunError("--plot: no backend finished, nothing to plot")
    fig, ax = plt.subplots(figsize=(max(4, 1.4 * len(rows)), 3.5))
    spp = result["batch"]["samples_per_step"]
    heights = [r["samples_per_s"] for _, r in rows]
    # the bars: samples/s over all timed steps; the whiskers: the slowest and fastest step
    lo = [max(0.0, h - spp / r["step_s"]["max"]) for h, (_, r) in zip(heights, rows, strict=True)]
    hi = [max(0.0, spp / r["step_s"]["min"] - h) for h, (_, r) in zip(heights, rows, strict=True)]
    bars = ax.bar(
        [lbl for lbl, _ in rows],
        heights,
        yerr=[lo, hi],
        capsize=4,
        color=["#888" if lbl == result["baseline"] else "#3a7" for lbl, _ in rows],
    )
    for bar, (_, r) in zip(bars, rows, strict=True):
        if r.get("ratio_vs_torch") is not None:
            ax.annotate(
                f"{r['ratio_vs_torch']:.2f}×",
                (bar.get_x() + bar.get_width() / 2, 0),
                xytext=(0, 4),
                textcoords="offset points",
                ha="center",
                color="white",
            )
    ax.set_ylabel("samples/s (bars: min–max step)")
    ax.set_title(f"{Path(result['recipe']).name}: {result['machine']['cpu'][:40]}", fontsize=9)
    plt.xticks(rotation=20, ha="right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
