"""Progress and log lines print user text literally: labels, paths and metric names may hold
square brackets, which Rich would read as markup (``[/x]`` raised ``MarkupError``)."""

from __future__ import annotations

import io
import logging

import pytest
from rich.console import Console

from ortft.core import progress

USER_TEXT = "label [/x] and [bold]kept[/bold] in /data/[/x]/train.csv"


@pytest.fixture
def stderr(monkeypatch: pytest.MonkeyPatch) -> io.StringIO:
    """progress's console, writing into a buffer (no colour: the text alone)."""
    buf = io.StringIO()
    console = Console(file=buf, highlight=False, no_color=True, width=200)
    monkeypatch.setattr(progress, "_console", console)
    return buf


def test_a_log_record_prints_user_text_literally(stderr: io.StringIO) -> None:
    progress.setup_logging()
    log = logging.getLogger("ortft")
    log.info("reading %s", USER_TEXT)
    log.warning("skipped %s", USER_TEXT)
    assert stderr.getvalue().splitlines() == [
        f"ortft reading {USER_TEXT}",
        f"ortft warning: skipped {USER_TEXT}",
    ]


def test_progress_lines_and_evals_print_user_text_literally(stderr: io.StringIO) -> None:
    with progress.Progress(total=2) as bar:
        bar.log(f"step 1/2  {USER_TEXT}")
        bar.eval({"f1_[/x]": 0.5, "[bold]accuracy": 0.25})
    assert stderr.getvalue().splitlines() == [
        f"ortft step 1/2  {USER_TEXT}",
        "ortft eval  f1_[/x] 0.5000  [bold]accuracy 0.2500",
    ]


def test_the_live_bar_shows_metric_names_literally(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a terminal the bar's eval column holds the metric names too."""
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, no_color=True, width=200)
    monkeypatch.setattr(progress, "_console", console)
    with progress.Progress(total=2) as bar:
        bar.update(1, loss=0.5)
        bar.eval({"f1_[/x]": 0.5})
        bar._bar.refresh()
    assert "eval f1_[/x] 0.5000" in buf.getvalue()
