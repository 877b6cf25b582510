"""The run directory: where a run writes, who owns it, whether it resumes, and the command that
resumes it."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shlex
from collections.abc import Callable, Iterator
from pathlib import Path

from ortft.checkpoint import store as checkpoint
from ortft.core.errors import InputError
from ortft.recipe.io import LoadedRecipe
from ortft.recipe.schema import default_output_dir


def resolve(loaded: LoadedRecipe, output_dir: Path | None) -> Path:
    """--output-dir, else checkpoint.output_dir, else runs/<recipe stem>."""
    if output_dir is not None:
        return Path(output_dir)
    return Path(loaded.recipe.checkpoint.output_dir or default_output_dir(loaded.path))


def make(run_dir: Path) -> None:
    """Create the run directory and prove it is writable, before any work is done."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise InputError(
            f"output dir {run_dir} is not writable ({err.strerror or err}); "
            "choose another --output-dir or checkpoint.output_dir"
        ) from None


def find_resume(
    loaded: LoadedRecipe, run_dir: Path, problem: Callable[[Path], str | None]
) -> Path | None:
    """The checkpoint to resume from (checkpoint.resume: auto | never | a path), or None.

    ``problem(path)`` is the engine's say on whether it can resume from ``path``."""
    mode = loaded.recipe.checkpoint.resume
    if mode == "never":
        if checkpoint.list_checkpoints(run_dir):
            raise InputError(
                f"{run_dir} holds checkpoints of an earlier run and checkpoint.resume=never; "
                "choose another --output-dir or remove it"
            )
        return None
    path = checkpoint.latest_good(run_dir) if mode == "auto" else loaded.resolve_path(mode)
    if path is None:
        return None
    why = problem(path)
    if why:
        raise InputError(f"checkpoint.resume: {path}: {why}")
    return path


def resume_command(loaded: LoadedRecipe, run_dir: Path) -> str:
    """The command that continues this run: the same recipe and overrides, resuming."""
    again = [o for o in loaded.overrides if not o.startswith("checkpoint.resume=")]
    if loaded.recipe.checkpoint.resume != "auto":  # never (or another path) would not resume
        again.append("checkpoint.resume=auto")
    args = ["ortft", "train", str(loaded.path or "RECIPE"), *again, "--output-dir", str(run_dir)]
    return shlex.join(args)


LOCK_NAME = ".ortft.lock"


@contextlib.contextmanager
def lock(run_dir: Path) -> Iterator[None]:
    """The run owns ``run_dir`` while it lives: an exclusive ``flock`` on ``<run>/.ortft.lock``.

    A second run on the same directory gets a one-line error naming the holder's pid (exit 2).
    The kernel drops the lock when its process dies, so a run killed with kill -9 leaves no stale
    lock: the pid written in the file is information, never the lock itself. Under torchrun only
    global rank 0 takes it (the other ranks and nodes share the directory); after an elastic
    restart the new rank 0 takes it again. On NFS, Linux emulates flock with byte-range locks
    (lockd); a filesystem without working locks makes two runs on one directory possible again.
    """
    if os.environ.get("RANK", "0") != "0":
        yield
        return
    path = run_dir / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            raise InputError(
                f"{run_dir} is in use by another ortft run (pid {holder}); wait for it to "
                "finish, or choose another --output-dir"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock
