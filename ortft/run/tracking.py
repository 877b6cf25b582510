"""Where metric rows go: metrics.jsonl always, TensorBoard and a PNG of the curves by option.

``recipe.logging.tensorboard`` writes event files to ``<run>/tensorboard/`` (scalars
``train/loss``, ``train/lr``, ``eval/<metric>``); ``recipe.logging.plot`` draws
``<run>/curves.png`` from metrics.jsonl when the run ends. Both libraries are optional
extras: ``check`` fails before training with the install command when one is missing.
"""

from __future__ import annotations

import importlib.util
import json
import logging
from pathlib import Path
from typing import Any

from ortft.core.errors import InputError
from ortft.recipe.schema import LoggingSection
from ortft.run import report

log = logging.getLogger("ortft")

PLOT_NAME = "curves.png"


def check(spec: LoggingSection) -> None:
    """The optional packages a recipe's logging needs are installed (an input error if not)."""
    need = [("tensorboard", "logging.tensorboard", "tensorboard")] if spec.tensorboard else []
    need += [("matplotlib", "logging.plot", "matplotlib")] if spec.plot else []
    for module, field, package in need:
        if importlib.util.find_spec(module) is None:
            raise InputError(
                f"{field}: needs the '{package}' package: "
                f"pip install -c requirements/lock.txt -r requirements/extras.txt "
                f"(or pip install {package}; pinned in requirements/extras.txt)"
            )


class Tracker:
    """``write(row)`` like ``report.MetricsLog``, also to TensorBoard; ``close()`` at the end."""

    def __init__(self, run_dir: Path, spec: LoggingSection, truncate_after_step: int | None):
        check(spec)
        self.run_dir, self.spec = run_dir, spec
        self.jsonl = report.MetricsLog(run_dir / "metrics.jsonl", truncate_after_step)
        self.tb: Any = None
        if spec.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            # purge_step: a resumed run drops the events logged after its checkpoint
            self.tb = SummaryWriter(str(run_dir / "tensorboard"), purge_step=truncate_after_step)

    def write(self, row: dict[str, Any]) -> None:
        self.jsonl.write(row)
        if self.tb is None:
            return
        kind, step = row["kind"], row["step"]
        for key, value in row.items():
            if key not in ("kind", "step", "epoch", "time_s") and isinstance(value, (int, float)):
                self.tb.add_scalar(f"{kind}/{key}", value, step)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
            self.tb = None
        if self.spec.plot:
            try:
                plot(self.jsonl.path, self.run_dir / PLOT_NAME)
            except Exception as err:  # noqa: BLE001 - a plot never fails a run
                log.warning("could not draw %s: %s", PLOT_NAME, err)


def plot(metrics_jsonl: Path, out: Path) -> Path:
    """Train loss (and eval loss) against steps on the left; the other eval metrics on the right."""
    import matplotlib

    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in metrics_jsonl.read_text().splitlines() if line.strip()]
    train = [r for r in rows if r["kind"] == "train"]
    evals = [r for r in rows if r["kind"] == "eval"]
    others = sorted({k for r in evals for k in r} - {"kind", "step", "epoch", "loss"})
    fig, axes = plt.subplots(1, 2 if others else 1, figsize=(11 if others else 6, 4), squeeze=False)
    ax = axes[0][0]
    ax.plot([r["step"] for r in train], [r["loss"] for r in train], label="train loss")
    if evals:
        ax.plot([r["step"] for r in evals], [r["loss"] for r in evals], "o-", label="eval loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.legend()
    if others:
        ax = axes[0][1]
        for key in others:
            ax.plot([r["step"] for r in evals], [r[key] for r in evals], "o-", label=f"eval {key}")
        ax.set_xlabel("step")
        ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
