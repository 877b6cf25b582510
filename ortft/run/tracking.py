"""Where metric rows go: metrics.jsonl always, the trackers of ``logging.trackers``, a PNG.

Rows reach TensorBoard as they come (a resume purges what it redoes); MLflow and W&B get them
when a checkpoint is written and at the end, so a run killed and resumed shows every step once
(their stores cannot take a point back). The tracker run ids go into the checkpoint
(``TrainState.trackers``) and a resume reopens the same runs. A tracker that fails mid-run
(disk full, server gone) is dropped with a one-line warning, recorded in summary.json; the run
goes on. ``logging.plot`` draws ``<run>/curves.png`` from metrics.jsonl when the run ends.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path
from typing import Any, Protocol

from ortft.core.errors import InputError, first_line
from ortft.recipe.tracking import LoggingSection
from ortft.run import report, trackers

log = logging.getLogger("ortft")

PLOT_NAME = "curves.png"


def check(spec: LoggingSection, run_dir: Path | None = None) -> None:
    """The packages a recipe's logging needs are installed, its URI valid (an input error if not)."""
    trackers.check(spec, run_dir or Path.cwd())
    if spec.plot and importlib.util.find_spec("matplotlib") is None:
        raise InputError(
            "logging.plot: needs the 'matplotlib' package: "
            "pip install -c requirements/lock.txt -r requirements/extras.txt"
        )


class Sink(Protocol):
    """What the loop and the lifecycle call on a tracker: ``Tracker``, or the no-op one of
    ranks other than 0."""

    warnings: list[str]

    def write(self, row: dict[str, Any]) -> None: ...

    def commit(self, step: int) -> None: ...

    def close(self, status: str = "completed", artifacts: list[Path] | None = None) -> None: ...

    def report(self) -> dict[str, Any]: ...


class Tracker:
    """``write(row)`` like ``report.MetricsLog``, also to each tracker; ``commit(step)`` when a
    checkpoint holds ``step``; ``close(status, artifacts)`` at the end."""

    def __init__(
        self,
        run_dir: Path,
        spec: LoggingSection,
        truncate_after_step: int | None,
        *,
        ids: dict[str, str] | None = None,
        params: dict[str, str] | None = None,
        tags: dict[str, str] | None = None,
        parent: dict[str, str] | None = None,
    ):
        # check(spec) ran before training (lifecycle): an InputError there, not a warning here
        self.run_dir, self.spec = run_dir, spec
        self.jsonl = report.MetricsLog(run_dir / "metrics.jsonl", truncate_after_step)
        self.ids = ids if ids is not None else {}  # the checkpoint's TrainState.trackers
        self.pending: list[dict[str, Any]] = []  # rows the non-live trackers have not had yet
        self.warnings: list[str] = []
        self.sinks: list[Any] = []
        self.places: dict[str, Any] = {}  # summary.json's record of where each tracker wrote
        for name in spec.trackers:
            ctx = trackers.Context(
                run_dir,
                spec,
                params or {},
                {**(tags or {}), **spec.tags},
                resume_id=self.ids.get(name) if truncate_after_step is not None else None,
                resume_step=truncate_after_step,
                parent=parent or {},
            )
            sink = self._guard(name, "start", trackers.open_sink, name, ctx)
            if sink is not None:
                self.sinks.append(sink)
                self.places[name] = sink.where()
                if sink.run_id:
                    self.ids[name] = sink.run_id

    def _guard(self, name: str, what: str, fn: Any, *args: Any) -> Any:
        """``fn(*args)``; a failure drops the tracker with one warning (the run goes on)."""
        try:
            return fn(*args)
        except Exception as err:  # noqa: BLE001 - a tracker never fails a run
            first = first_line(err, 200)
            line = f"{name}: could not {what}: {type(err).__name__}: {first}"
            log.warning("tracker %s; it is off for the rest of this run", line)
            self.warnings.append(line)
            self.sinks = [s for s in self.sinks if s.name != name]
            return None

    def write(self, row: dict[str, Any]) -> None:
        self.jsonl.write(row)
        self.pending.append(row)
        for sink in [s for s in self.sinks if s.live]:
            self._guard(sink.name, "log", sink.log, [row])

    def commit(self, step: int) -> None:
        """A checkpoint now holds ``step``: the rows up to it go to MLflow and W&B."""
        ready = [r for r in self.pending if r["step"] <= step]
        self.pending = [r for r in self.pending if r["step"] > step]
        for sink in [s for s in self.sinks if not s.live]:
            self._guard(sink.name, "log", sink.log, ready)

    def close(self, status: str = "completed", artifacts: list[Path] | None = None) -> None:
        """A finished run sends every row; a failed one only those a checkpoint holds (its resume
        redoes the rest). Then the artifacts that exist, and the run's end status."""
        if status in ("completed", "stopped"):
            self.commit(max((r["step"] for r in self.pending), default=0))
        files = [p for p in artifacts or [] if p.is_file()]
        for sink in list(self.sinks):
            self._guard(sink.name, "finish", sink.close, status, files)
        self.sinks = []
        if self.spec.plot:
            try:
                plot(self.jsonl.path, self.run_dir / PLOT_NAME)
            except Exception as err:  # noqa: BLE001 - a plot never fails a run
                log.warning("could not draw %s: %s", PLOT_NAME, err)

    def report(self) -> dict[str, Any]:
        """summary.json's ``trackers``: where each wrote, and the warnings of those that failed."""
        return {**self.places, "warnings": self.warnings} if self.spec.trackers else {}


def plot(metrics_jsonl: Path, out: Path) -> Path:
    """This run's loss, learning rate and eval curves (``run/curves.py``, as ``ortft plot``)."""
    from ortft.run import curves

    return curves.save(curves.figure([curves.read(metrics_jsonl.parent, metrics_jsonl)]), out)
