"""Progress and log lines on stderr (stdout stays for results).

A Rich progress bar when stderr is a terminal; plain lines otherwise (CI logs). Every line is
printed as plain text, never as Rich markup: messages carry user text (labels, paths, metric
names), and a ``[/x]`` in one would otherwise raise ``MarkupError`` and stop the run.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from rich.console import Console
from rich.text import Text

_console = Console(stderr=True, highlight=False)


def _line(message: str) -> Text:
    """The dimmed "ortft" tag, then ``message`` exactly as given (no markup parsed)."""
    return Text.assemble(("ortft", "dim"), " ", message)


class _Handler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        prefix = "" if record.levelno < logging.WARNING else f"{record.levelname.lower()}: "
        _console.print(_line(prefix + record.getMessage()), highlight=False, soft_wrap=True)


def setup_logging(level: int = logging.INFO) -> None:
    log = logging.getLogger("ortft")
    if not any(isinstance(h, _Handler) for h in log.handlers):
        log.addHandler(_Handler())
    log.setLevel(level)
    log.propagate = False


class Progress:
    """Step counter with a live bar on terminals; ``log`` prints a line above it."""

    def __init__(self, total: int, start: int = 0):
        self.total, self.start = total, start
        self._bar: Any = None
        self._task: Any = None

    def __enter__(self) -> Progress:
        if _console.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(
                TextColumn("train"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("loss {task.fields[loss]}", markup=False),
                TextColumn("{task.fields[eval]}", markup=False),  # metric names: user labels
                TimeRemainingColumn(),
                console=_console,
                transient=True,
            )
            self._bar.start()
            self._task = self._bar.add_task(
                "train", total=self.total, completed=self.start, loss="-", eval=""
            )
        return self

    def update(self, step: int, loss: float) -> None:
        if self._bar is not None:
            self._bar.update(self._task, completed=step, loss=f"{loss:.4f}")

    def eval(self, metrics: dict[str, float]) -> None:
        """An eval: one line in the log, and its metrics (not the loss) kept on the bar."""
        self.log("eval  " + "  ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
        if self._bar is not None:
            shown = {k: v for k, v in metrics.items() if k != "loss"} or metrics
            self._bar.update(
                self._task, eval="eval " + " ".join(f"{k} {v:.4f}" for k, v in shown.items())
            )

    def log(self, line: str) -> None:
        _console.print(_line(line), highlight=False, soft_wrap=True)

    def __exit__(self, *exc: Any) -> None:
        if self._bar is not None:
            self._bar.stop()
        sys.stderr.flush()
