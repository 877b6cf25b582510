"""Curves of one run or several, from their ``metrics.jsonl``: loss (train and eval), learning
rate and the other eval metrics against the step. ``logging.plot`` draws a run's own
``curves.png`` with it (``run/tracking.py``), ``ortft plot RUN [RUN ...]`` several runs in one
picture. ``figure`` returns the matplotlib Figure, so tests count its lines and labels.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ortft.core.errors import InputError, UsageError
from ortft.run.summary import RunSummary

# eval row keys that are not a metric to draw (loss has its own panel)
NOT_METRICS = {"kind", "step", "epoch", "loss", "time_s"}


@dataclass
class RunCurves:
    """What one run logged: its name (the folder), its backend (summary.json's backend.used,
    "" before the run wrote one) and its train / eval rows."""

    name: str
    backend: str = ""
    train: list[dict[str, Any]] = field(default_factory=list)
    evals: list[dict[str, Any]] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.name} ({self.backend})" if self.backend else self.name

    def metrics(self) -> list[str]:
        return sorted({k for r in self.evals for k in r} - NOT_METRICS)


def read(run_dir: Path, metrics_file: Path | None = None) -> RunCurves:
    """A run folder's curves; InputError naming the folder when it has no metrics.jsonl."""
    jsonl = metrics_file or run_dir / "metrics.jsonl"
    if not run_dir.is_dir():
        raise InputError(f"{run_dir}: no such run folder")
    try:
        text = jsonl.read_text(encoding="utf-8")
    except OSError:
        raise InputError(f"{run_dir}: no metrics.jsonl (not a run folder?)") from None
    rows = []
    for line in text.splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a killed run's half-written last line
    summary = RunSummary.read(run_dir / "summary.json")
    backend = summary.backend.used if summary is not None and summary.backend else ""
    return RunCurves(
        name=run_dir.resolve().name,
        backend=backend or "",
        train=[r for r in rows if r.get("kind") == "train" and "loss" in r],
        evals=[r for r in rows if r.get("kind") == "eval"],
    )


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise UsageError(
            "plotting needs matplotlib: pip install -c requirements/lock.txt matplotlib"
        ) from None
    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    return plt


def figure(runs: list[RunCurves]) -> Any:
    """One panel each for loss, learning rate and (when any run has them) the other eval
    metrics; a colour per run, train solid, eval dashed with dots. The caller closes it."""
    plt = _pyplot()
    metrics = sorted({m for run in runs for m in run.metrics()})
    panels = 3 if metrics else 2
    fig, axes = plt.subplots(1, panels, figsize=(5.5 * panels, 4), squeeze=False)
    loss, lr = axes[0][0], axes[0][1]
    for i, run in enumerate(runs):
        color = f"C{i % 10}"
        steps = [r["step"] for r in run.train]
        loss.plot(steps, [r["loss"] for r in run.train], color=color, label=f"{run.label} train")
        if run.evals:
            loss.plot(
                [r["step"] for r in run.evals],
                [r["loss"] for r in run.evals],
                "o--",
                color=color,
                label=f"{run.label} eval",
            )
        with_lr = [r for r in run.train if "lr" in r]
        if with_lr:
            lr.plot(
                [r["step"] for r in with_lr],
                [r["lr"] for r in with_lr],
                color=color,
                label=run.label,
            )
        for j, key in enumerate(metrics):
            rows = [r for r in run.evals if key in r]
            if rows:
                axes[0][2].plot(
                    [r["step"] for r in rows],
                    [r[key] for r in rows],
                    ["o--", "s:", "^-."][j % 3],
                    color=color,
                    label=f"{run.label} eval {key}",
                )
    titles = ["loss", "learning rate", "eval metrics"]
    for ax, title in zip(axes[0], titles, strict=False):
        ax.set_title(title)
        ax.set_xlabel("step")
        if ax.get_lines():
            ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def save(fig: Any, out: Path) -> Path:
    """Write the figure as a PNG (parent folders made) and close it."""
    plt = _pyplot()
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        fig.savefig(out, dpi=100)
    finally:
        plt.close(fig)
    return out


def plot_runs(run_dirs: list[Path], out: Path) -> Path:
    """``ortft plot``: every run's curves in one picture at ``out``."""
    return save(figure([read(Path(d)) for d in run_dirs]), out)


def embed(report: Path, picture: Path) -> Path:
    """Append the picture to a Markdown report (``ortft train --report x.md`` wrote it, or a
    new one), linked relative to the report so the pair can be uploaded together."""
    import os

    from ortft.core import fsutil

    old = report.read_text(encoding="utf-8") if report.is_file() else ""
    report.parent.mkdir(parents=True, exist_ok=True)
    link = Path(os.path.relpath(picture.resolve(), report.resolve().parent)).as_posix()
    text = old.rstrip("\n") + ("\n\n" if old.strip() else "")
    fsutil.write_text_atomic(report, f"{text}![loss, learning rate and eval curves]({link})\n")
    return report
