"""What every command module shares: the --debug switch, the guard that turns an ``OrtftError``
(or Ctrl-C, or a missing optional package) into one error line and an exit code, the --json option, the trained-model argument
and the backend's process environment.

It sits below the command modules and ``app.py`` (which imports them all), so that none of them
imports ``app.py``. Like every module here, it imports no heavy library at module level.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from ortft.cli.output import err
from ortft.core.errors import EXIT_USAGE, OrtftError
from ortft.env import extras

# set by the app's callback from --debug before any command runs
state = {"debug": False}


def guarded(fn, *args: Any, **kwargs: Any) -> Any:
    """Call a command body, turning OrtftError (and Ctrl-C) into a message and exit code."""
    try:
        return fn(*args, **kwargs)
    except OrtftError as error:
        if state["debug"]:
            raise
        err(str(error))
        raise typer.Exit(error.exit_code) from None
    except KeyboardInterrupt:
        err("interrupted")
        raise typer.Exit(130) from None
    except ModuleNotFoundError as error:  # an optional package (an extra) that is not installed
        line = extras.missing_module_line(error)
        if line is None or state["debug"]:
            raise
        err(line)
        raise typer.Exit(EXIT_USAGE) from None


# the argument `ortft eval` and `ortft predict` share
TrainedModel = Annotated[
    Path,
    typer.Argument(help="Run dir, saved HF model dir, or ONNX export folder.", show_default=False),
]


def json_option(help: str) -> Any:
    """The --json flag of every command that prints a result."""
    return typer.Option("--json", help=help)


def thread_env(backend: str) -> None:
    """The backend's process environment (ORT: libgomp's spin count), set before torch loads."""
    import os

    from ortft import backends

    if "torch" not in sys.modules:
        for key, value in backends.process_env(backend).items():
            os.environ.setdefault(key, value)
