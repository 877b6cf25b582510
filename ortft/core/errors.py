"""The one error hierarchy ortft raises for things a user can fix or should know about.

The CLI turns each into a single readable line on stderr and the exit code it carries;
anything else is a bug and keeps its traceback (shown with ``--debug``).
"""

from __future__ import annotations

from typing import Any

# Exit codes shared by every command.
EXIT_OK = 0
EXIT_FAILED = 1  # failed while running
EXIT_USAGE = 2  # usage / recipe / input error found before running
EXIT_GATE = 3  # a quality gate (or a parity check) failed
EXIT_SIGINT = 130
EXIT_SIGTERM = 143


class OrtftError(Exception):
    """Base class: ``str(err)`` is the one line shown to the user."""

    exit_code = EXIT_FAILED


class UsageError(OrtftError):
    """A bad command-line argument."""

    exit_code = EXIT_USAGE


class RecipeError(OrtftError):
    """A recipe that does not validate; ``problems`` holds one line per error."""

    exit_code = EXIT_USAGE

    def __init__(self, problems: list[str] | str, source: str | None = None):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        self.source = source
        head = f"{source}: " if source else ""
        if len(self.problems) == 1:
            msg = head + self.problems[0]
        else:
            msg = (
                head
                + f"{len(self.problems)} problems\n"
                + "\n".join(f"  - {p}" for p in self.problems)
            )
        super().__init__(msg)


class InputError(OrtftError):
    """A data file, model directory or checkpoint that cannot be used (found before training)."""

    exit_code = EXIT_USAGE


class RunError(OrtftError):
    """Training or export failed while running."""

    exit_code = EXIT_FAILED


class BackendError(RunError):
    """The requested backend could not run the model (and fallback is off)."""


class GateError(OrtftError):
    """A quality gate or parity check failed; the run itself completed."""

    exit_code = EXIT_GATE

    def __init__(self, message: str, summary: Any = None):
        super().__init__(message)
        self.summary = summary  # the run's RunSummary, for --json and --report


class Interrupted(OrtftError):
    """SIGINT / SIGTERM stopped the run after a checkpoint was written."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.exit_code = EXIT_SIGINT if signum == 2 else EXIT_SIGTERM


class Stopped(OrtftError):
    """A caller's hook ended the run on purpose (``ortft hpo`` pruning a trial)."""

    run_status = "pruned"  # what summary.json records as the run's status


def first_line(err: BaseException, limit: int = 300) -> str:
    """What a one-line error quotes of ``err``: its message's first line, cut to ``limit``
    characters, or its type's name when it says nothing."""
    text = str(err).strip()
    return text.splitlines()[0][:limit] if text else type(err).__name__
