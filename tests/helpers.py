"""The one way tests run the ortft CLI in a subprocess, and read back what a run wrote.

A real process, as users run it: ORTModule redirects the OS-level stdout/stderr while it exports,
which needs real file descriptors (an in-process CliRunner has none), and a process keeps each
run's logging, signal handlers and torch state apart. tests/test_helpers_used.py fails on any
other command line that runs `python -m ortft` under tests/.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, overload

DEFAULT_TIMEOUT = 600  # seconds; most runs are a tiny model for a few steps


def cli_argv(
    *args: object,
    launcher: Sequence[str] = (),
    code: str | None = None,
    python: str | Path | None = None,
) -> list[str]:
    """``[python, *launcher, -m ortft, *args]``, each argument made a string.

    ``launcher``: what runs between the interpreter and ortft, e.g. ``("-m",
    "torch.distributed.run", "--standalone", "--nproc_per_node=2")``. ``code``: ``-c code``
    in place of ``-m ortft``, a wrapper that calls ortft's ``main`` (and reports on the way out).
    ``python``: another venv's interpreter (default: this one's).
    """
    head = ["-c", code] if code is not None else ["-m", "ortft"]
    return [str(python or sys.executable), *launcher, *head, *map(str, args)]


def cli_env(
    env: Mapping[str, str] | None = None, base_env: Mapping[str, str] | None = None
) -> dict[str, str] | None:
    """``env`` over ``base_env`` (default: ``os.environ`` now); None, i.e. inherit, when both are
    None. Read ``os.environ`` at call time, it holds conftest's per-session ORTFT_CACHE."""
    if env is None and base_env is None:
        return None
    return {**(os.environ if base_env is None else base_env), **(env or {})}


def run_cli(
    *args: object,
    timeout: float | None = DEFAULT_TIMEOUT,
    env: Mapping[str, str] | None = None,
    base_env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    check: bool = False,
    input: str | None = None,
    launcher: Sequence[str] = (),
    code: str | None = None,
    python: str | Path | None = None,
    **kw: Any,
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m ortft ARGS`` to the end, text output captured.

    ``env``: variables set on top of ``base_env`` (default: the current ``os.environ``);
    neither given, the process inherits this one's environment. ``timeout=None``: no limit.
    ``launcher``, ``code`` and ``python`` as in :func:`cli_argv`; ``kw`` goes to
    ``subprocess.run``.
    """
    return subprocess.run(
        cli_argv(*args, launcher=launcher, code=code, python=python),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=cli_env(env, base_env),
        cwd=cwd,
        check=check,
        input=input,
        **kw,
    )


def start_cli(
    *args: object,
    env: Mapping[str, str] | None = None,
    base_env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    launcher: Sequence[str] = (),
    code: str | None = None,
    **popen_kw: Any,
) -> subprocess.Popen:
    """Start ``python -m ortft ARGS`` in the background (to signal, kill or race it); the
    environment as in :func:`run_cli`; ``popen_kw`` (stdout, stderr, text...) go to Popen."""
    return subprocess.Popen(
        cli_argv(*args, launcher=launcher, code=code),
        env=cli_env(env, base_env),
        cwd=cwd,
        **popen_kw,
    )


def summary(run_dir: Path) -> dict[str, Any]:
    """The run's summary.json."""
    return json.loads((run_dir / "summary.json").read_text())


@overload
def losses(
    run_dir: Path, *, by_step: Literal[False] = False, unique_steps: bool = False
) -> list[float]: ...
@overload
def losses(
    run_dir: Path, *, by_step: Literal[True], unique_steps: bool = False
) -> dict[int, float]: ...
def losses(
    run_dir: Path, *, by_step: bool = False, unique_steps: bool = False
) -> list[float] | dict[int, float]:
    """The training losses a run logged to metrics.jsonl, in step order; ``by_step``: as
    ``{step: loss}``. ``unique_steps``: assert no step was logged twice."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["kind"] == "train"]
    if unique_steps:
        steps = [r["step"] for r in train]
        assert len(steps) == len(set(steps)), "a step was logged twice"
    if by_step:
        return {r["step"]: r["loss"] for r in train}
    return [r["loss"] for r in train]
