"""The one way tests run the ortft CLI in a subprocess, and read back what a run wrote.

A real process, as users run it: ORTModule redirects the OS-level stdout/stderr while it exports,
which needs real file descriptors (an in-process CliRunner has none), and a process keeps each
run's logging, signal handlers and torch state apart. tests/test_helpers_used.py fails on any
other command line that runs `python -m ortft` under tests/.

run_cli forks most runs from tests/forkserver.py, a process that has imported torch,
transformers and datasets once (the module says why and what keeps a fresh process);
``ORTFT_TEST_FORK=0`` starts every run fresh.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, Literal, overload

from ortft import backends

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
    forkable = not (launcher or code is not None or python is not None or kw)
    if forkable and _SERVER.enabled():
        child_env = forked_env(cli_env(env, base_env) or os.environ)
        with _SERVER.take(child_env) as server:
            if server is not None:
                done = server.run(list(map(str, args)), child_env, cwd, input, timeout)
                _SERVER.forks += 1
                if check and done.returncode:
                    raise subprocess.CalledProcessError(
                        done.returncode, done.args, done.stdout, done.stderr
                    )
                return done
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


# Variables a library imported by the fork server reads at import (threads, caches, device
# and launcher settings, Python's own flags): runs that differ in one fork from different servers.
FRESH_PROCESS_ENV = (
    "PYTHON", "OMP_", "MKL_", "KMP_", "GOMP_", "OPENBLAS", "NUMEXPR", "TORCH", "PYTORCH",
    "LD_", "CUDA", "NVIDIA", "HIP", "ROCM", "ORT_", "ONNXRUNTIME", "HF_", "HUGGINGFACE",
    "TRANSFORMERS", "TOKENIZERS", "DATASETS", "SAFETENSORS", "NCCL", "GLOO", "MASTER_",
    "RANK", "WORLD_SIZE", "LOCAL_", "GROUP_", "DS_", "DEEPSPEED", "ACCELERATE", "HOME",
    "XDG_", "TMPDIR", "TZ", "LANG", "LC_",
)  # fmt: skip
FORK_SERVER = Path(__file__).resolve().parent / "forkserver.py"
MAX_SERVERS = 2  # a test that sets OMP_NUM_THREADS gets its own; each holds ~0.7 GB


def forked_env(env: Mapping[str, str]) -> dict[str, str]:
    """A forked run's environment: ``env`` over what the CLI sets for the ort backend before
    torch loads (libgomp reads it then, and a fork can no longer set it)."""
    return {**backends.process_env("ort"), **env}


def import_env(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """What of ``env`` the server's imports read: runs with the same fork from one server."""
    return tuple(sorted((k, v) for k, v in env.items() if k.startswith(FRESH_PROCESS_ENV)))


class _ForkServer:
    """One tests/forkserver.py process (see there), started under ``env``; ended with its stdin."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(FORK_SERVER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=dict(env),
        )
        self.pending = b""
        self._read(timeout=DEFAULT_TIMEOUT)  # {"ready": true}: imported
        self.scratch = Path(tempfile.mkdtemp(prefix="ortft-forks-"))
        self.runs, self.last_pid = 0, 0

    def _read(self, timeout: float | None) -> dict:
        """The server's next line; unbuffered reads, so that select never waits on a line that a
        buffer already holds."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.pending:
            if timeout is not None and not select.select([fd], [], [], timeout)[0]:
                raise TimeoutError
            chunk = os.read(fd, 65536)
            if not chunk:
                raise RuntimeError(f"{FORK_SERVER.name} ended (exit {self.proc.wait()})")
            self.pending += chunk
        line, _, self.pending = self.pending.partition(b"\n")
        return json.loads(line)

    def run(
        self,
        args: list[str],
        env: dict[str, str],
        cwd: str | Path | None,
        input: str | None,
        timeout: float | None,
    ) -> subprocess.CompletedProcess[str]:
        stdin, stdout, stderr = (self.scratch / n for n in ("stdin", "stdout", "stderr"))
        stdin.write_text(input or "")
        stdout.write_text("")
        stderr.write_text("")
        request = {
            "args": args, "env": env, "cwd": str(Path(cwd or os.getcwd()).resolve()),
            "stdin": str(stdin), "stdout": str(stdout), "stderr": str(stderr),
        }  # fmt: skip
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(request) + "\n").encode())
        self.proc.stdin.flush()
        pid = self.last_pid = self._read(timeout=DEFAULT_TIMEOUT)["pid"]
        self.runs += 1
        argv = cli_argv(*args)
        try:
            returncode = self._read(timeout)["returncode"]
        except TimeoutError:
            os.kill(pid, 9)  # as subprocess.run kills its child on a timeout
            self._read(timeout=None)
            raise subprocess.TimeoutExpired(
                argv, timeout or 0, stdout.read_text(), stderr.read_text()
            ) from None
        return subprocess.CompletedProcess(argv, returncode, stdout.read_text(), stderr.read_text())

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait()
        shutil.rmtree(self.scratch, ignore_errors=True)


class _Servers:
    """This process's fork servers, one per import environment (the last MAX_SERVERS used), for
    one run at a time: a second, concurrent run starts fresh (it may be waiting on the first)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.servers: dict[tuple[tuple[str, str], ...], _ForkServer] = {}
        self.forks = 0  # runs forked so far, by every server

    def enabled(self) -> bool:
        return os.environ.get("ORTFT_TEST_FORK", "1") != "0"

    @contextlib.contextmanager
    def take(self, env: Mapping[str, str]) -> Iterator[_ForkServer | None]:
        if not self.lock.acquire(blocking=False):
            yield None
            return
        try:
            key = import_env(env)
            server = self.servers.pop(key, None)
            if server is None or server.proc.poll() is not None:
                server = _ForkServer(env)
                atexit.register(server.close)
            self.servers[key] = server  # the most recently used last
            while len(self.servers) > MAX_SERVERS:
                self.servers.pop(next(iter(self.servers))).close()
            yield server
        finally:
            self.lock.release()


_SERVER = _Servers()


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


def load_benchmark(name: str, monkeypatch: Any) -> ModuleType:
    """``benchmarks/<name>.py`` as a module, its folder on ``sys.path`` (the benches import their
    neighbours by name) and the module in ``sys.modules`` (a dataclass looks it up there)."""
    folder = Path(__file__).resolve().parent.parent / "benchmarks"
    monkeypatch.syspath_prepend(str(folder))
    spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module
