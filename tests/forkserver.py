"""A parent process that has imported torch, transformers and datasets, and forks each
`python -m ortft` run that tests/helpers.run_cli gives it.

Why: most of a tiny test run's CPU is the new process importing that stack (about 4 of a 10 s
`ortft train`), and the fast suite starts a few hundred of them. A fork inherits the imports
and is still a real process, as helpers.py asks of a run: its own file descriptors, logging,
signal handlers and torch state, its own exit code. ortft's own modules are not imported here,
so they import in the child, under the run's environment and working directory.

What a fork cannot give, helpers.run_cli keeps on a fresh process: another interpreter, a
launcher or ``-c`` code, and a changed environment variable that a pre-imported library reads at
import (helpers.FRESH_PROCESS_ENV). The CLI sets the ort backend's libgomp spin count before
torch loads (``ortft.backends.process_env``), which a fork can no longer do: helpers gives every
forked run that setting, and its server imports under it. Nothing here runs a parallel torch op,
so no OpenMP pool exists to be inherited half-made. A child ends as the interpreter ends (threads joined, atexit
functions run, stdio flushed) but skips the teardown of the pre-imported modules (finish).

Protocol, on stdin and stdout, one JSON line each: the server writes ``{"ready": true}`` once
it has imported; per request ``{"args", "env", "cwd", "stdin", "stdout", "stderr"}`` (the last
three are file paths) it answers ``{"pid"}`` after the fork and ``{"returncode"}`` when the
child ends (as subprocess does: negative for a signal). EOF on stdin ends the server.
"""

from __future__ import annotations

import atexit
import gc
import importlib
import json
import os
import random
import runpy
import signal
import sys
import threading

# what every `ortft` process imports before it does anything of a test's (measured with
# `python -X importtime -m ortft train ...`); nothing of ortft's own
PREIMPORT = (
    "numpy",
    "torch",
    "transformers",
    "transformers.modeling_utils",
    "datasets",
    "pydantic",
    "typer",
    "yaml",
    "safetensors.torch",
    "tokenizers",
)


def _reply(message: dict) -> None:
    os.write(1, (json.dumps(message) + "\n").encode())


def serve() -> dict | None:
    """Answer requests until stdin closes; in a forked child, return its request."""
    _reply({"ready": True})
    for line in sys.stdin.buffer:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            return request
        _reply({"pid": pid})
        _, status = os.waitpid(pid, 0)
        _reply({"returncode": os.waitstatus_to_exitcode(status)})
    return None


def become(request: dict) -> None:
    """Turn this forked child into `python -m ortft ARGS` as the request describes it."""
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for fd, path, flags in (
        (0, request["stdin"], os.O_RDONLY),
        (1, request["stdout"], os.O_WRONLY | os.O_TRUNC),
        (2, request["stderr"], os.O_WRONLY | os.O_TRUNC),
    ):
        opened = os.open(path, flags)
        os.dup2(opened, fd)
        os.close(opened)
    # a fresh process draws new seeds; forks would all share the server's
    random.seed()
    sys.modules["numpy"].random.seed()
    sys.path[0] = os.getcwd()  # as `python -m` puts it
    sys.argv = ["-m", *request["args"]]


def run_ortft() -> int:
    """`python -m ortft` in this process; its exit code, as the interpreter would give it."""
    try:
        runpy.run_module("ortft", run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            return stop.code or 0
        print(stop.code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        # as Python ends on an uncaught KeyboardInterrupt: killed by SIGINT
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:
        sys.excepthook(*sys.exc_info())
        return 1
    return 0


def finish(code: int) -> None:
    """End as the interpreter ends, less its teardown of the modules the server imported (about
    2 s of CPU in every run): join the threads, run the atexit functions (logging's flush,
    weakref finalizers), flush stdio, then exit."""
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    gc.collect()  # what a cycle holds (an unclosed file) is finalized, as at shutdown
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    for name in PREIMPORT:
        importlib.import_module(name)
    # the children then do not scan (and copy on write) the server's objects in each collection
    gc.freeze()
    forked = serve()
    if forked is not None:
        become(forked)
        finish(run_ortft())
