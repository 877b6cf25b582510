"""Curves across runs: `ortft plot RUN [RUN ...] -o curves.png` draws loss, learning rate and
eval metrics over steps, one colour per run, labelled by run folder and backend. The test
counts the Figure's lines and labels (ortft.run.curves.figure returns it), not pixels."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_cli_recipes import runner

from ortft.cli.app import app as cli
from ortft.core.errors import EXIT_USAGE
from ortft.recipe.schema import LoggingSection
from ortft.run import curves
from ortft.run.tracking import PLOT_NAME, Tracker


def make_run(folder: Path, backend: str | None, evals: bool) -> Path:
    """A run folder as a run leaves it: metrics.jsonl (4 train rows, evals at steps 2 and 4)
    and, when ``backend`` is given, a summary.json naming it."""
    folder.mkdir(parents=True)
    rows = [
        {"kind": "train", "step": s, "epoch": s / 4, "loss": 1.0 / s, "lr": 1e-3 * s, "time_s": s}
        for s in (1, 2, 3, 4)
    ]
    if evals:
        metrics = lambda s: {"loss": 1.2 / s, "accuracy": 0.2 * s, "f1_macro": 0.1 * s}  # noqa: E731
        rows += [{"kind": "eval", "step": s, "epoch": s / 4, **metrics(s)} for s in (2, 4)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if backend is not None:
        summary = {"format_version": 1, "status": "completed", "backend": {"used": backend}}
        (folder / "summary.json").write_text(json.dumps(summary))
    return folder


def labels(ax) -> list[str]:
    return [line.get_label() for line in ax.get_lines()]


def test_two_runs_in_one_figure(tmp_path: Path) -> None:
    a = make_run(tmp_path / "a", "ort", evals=True)
    b = make_run(tmp_path / "b", "torch", evals=False)
    fig = curves.figure([curves.read(a), curves.read(b)])
    try:
        loss, lr, metrics = fig.axes
        assert [ax.get_title() for ax in fig.axes] == ["loss", "learning rate", "eval metrics"]
        assert labels(loss) == ["a (ort) train", "a (ort) eval", "b (torch) train"]
        assert labels(lr) == ["a (ort)", "b (torch)"]
        assert labels(metrics) == ["a (ort) eval accuracy", "a (ort) eval f1_macro"]
        assert list(lr.get_lines()[1].get_ydata()) == pytest.approx([1e-3, 2e-3, 3e-3, 4e-3])
        assert list(metrics.get_lines()[0].get_xdata()) == [2, 4]
        # a colour per run, the same in every panel
        assert loss.get_lines()[0].get_color() == lr.get_lines()[0].get_color()
        assert loss.get_lines()[2].get_color() != loss.get_lines()[0].get_color()
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)


def test_plot_command_writes_the_png_and_embeds_it_in_a_report(tmp_path: Path) -> None:
    a = make_run(tmp_path / "runs" / "a", "ort", evals=True)
    b = make_run(tmp_path / "runs" / "b", None, evals=True)  # no summary.json yet: no backend
    out, report = tmp_path / "out" / "curves.png", tmp_path / "report.md"
    report.write_text("## ortft run: completed\n")
    result = runner.invoke(cli, ["plot", str(a), str(b), "-o", str(out), "--report", str(report)])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == str(out)
    assert out.read_bytes().startswith(b"\x89PNG")
    assert report.read_text() == (
        "## ortft run: completed\n\n![loss, learning rate and eval curves](out/curves.png)\n"
    )


@pytest.mark.parametrize("what", ["missing", "empty"])
def test_a_bad_run_is_one_line_naming_it(tmp_path: Path, what: str) -> None:
    good = make_run(tmp_path / "good", "ort", evals=False)
    bad = tmp_path / "bad"
    if what == "empty":
        bad.mkdir()
    result = runner.invoke(cli, ["plot", str(good), str(bad), "-o", str(tmp_path / "c.png")])
    assert result.exit_code == EXIT_USAGE, result.output
    assert result.stdout == ""
    assert len(result.stderr.splitlines()) == 1 and str(bad) in result.stderr, result.stderr
    assert not (tmp_path / "c.png").exists()


def test_logging_plot_draws_the_runs_own_curves(tmp_path: Path) -> None:
    """logging.plot: true draws <run>/curves.png with the same code at the end of a run."""
    run = make_run(tmp_path / "run", "torch", evals=True)
    rows = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").unlink()
    tracker = Tracker(run, LoggingSection(plot=True), None)
    for row in rows:
        tracker.write(json.loads(row))
    tracker.close()
    assert (run / PLOT_NAME).read_bytes().startswith(b"\x89PNG")
