"""Atomic writes: a file or a folder appears whole under its final name, or not at all.

Every writer in ortft that must survive a crash (checkpoints, best/, exports, on-device
artifacts, the tokenized-data cache, summary.json, CI reports, the extension cache) goes
through here:

- ``atomic_file`` / ``write_text_atomic`` / ``write_json_atomic``: a temp file beside the
  target (``.<name>.tmp-<pid>``), flushed and fsynced, then ``os.replace``-d over the target,
  and the folder fsynced so the rename itself is durable.
- ``atomic_dir``: a temp folder beside the target (``.<name>.tmp-<pid>``) that the caller
  fills; on success every file and folder in it is fsynced and it is swapped in. Replacing an
  existing folder never leaves a moment where the final name is missing: on Linux the two
  folders trade names in one ``renameat2(RENAME_EXCHANGE)`` and the old one (now under the
  temp name) is deleted afterwards. Any exception removes the temp folder; the old folder is
  then untouched.
- ``remove_stale``: temp files/folders a kill -9 left behind.

Stdlib only, no torch: the torch-free on-device loop uses it.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import json
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

_AT_FDCWD = -100  # <fcntl.h>: paths relative to the working directory
_RENAME_EXCHANGE = 2  # <linux/fs.h>: swap the two names atomically (Linux 3.15+)
_libc: Any = None


def temp_path(final: Path) -> Path:
    """Where the temp copy of ``final`` is written: beside it (same file system, so the rename
    is atomic), hidden, and tagged with the pid so two processes never share one."""
    return final.with_name(f".{final.name}.tmp-{os.getpid()}")


def fsync_dir(path: Path) -> None:
    """Make a rename or new entry in ``path`` durable (a file's fsync does not cover its name)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(folder: Path) -> None:
    """fsync every file under ``folder``, then every folder, deepest first."""
    for root, _dirs, files in os.walk(folder, topdown=False):
        for name in files:
            p = os.path.join(root, name)
            if os.path.islink(p):
                continue
            with open(p, "rb") as fh:
                os.fsync(fh.fileno())
        fsync_dir(Path(root))


# --------------------------------------------------------------------------- files


@contextlib.contextmanager
def atomic_file(path: Path, mode: str = "w", encoding: str | None = None) -> Iterator[IO[Any]]:
    """An open temp file beside ``path``; on success it is fsynced and renamed over ``path``.

    ``mode`` is "w" (text, UTF-8 unless ``encoding``) or "wb". On any exception the temp file
    is removed and ``path`` is left as it was.
    """
    path = Path(path)
    tmp = temp_path(path)
    if "b" not in mode and encoding is None:
        encoding = "utf-8"
    try:
        with open(tmp, mode, encoding=encoding) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    with contextlib.suppress(OSError):  # durability of the name only; the data is already safe
        fsync_dir(path.parent)


def write_text_atomic(path: Path, text: str) -> None:
    with atomic_file(path) as fh:
        fh.write(text)


def write_json_atomic(path: Path, obj: Any, *, indent: int = 2) -> None:
    """``obj`` as JSON (values JSON cannot hold written with ``str``), newline-terminated."""
    write_text_atomic(path, json.dumps(obj, indent=indent, default=str) + "\n")


# --------------------------------------------------------------------------- folders


def _exchange(a: Path, b: Path) -> bool:
    """Swap the names ``a`` and ``b`` in one step; False where the system cannot.

    Linux's renameat2(2) with RENAME_EXCHANGE, called through libc (glibc 2.28+ exports it;
    Python has no wrapper). Elsewhere (macOS, Windows, old glibc) and on file systems that
    refuse the flag (EINVAL: some network and FUSE file systems) this returns False and the
    caller falls back to a set-aside rename. Other errors (ENOSPC, EACCES, ...) are raised.
    """
    global _libc
    if not sys.platform.startswith("linux"):
        return False
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    fn = getattr(_libc, "renameat2", None)
    if fn is None:
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    rc = fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


def swap_into_place(tmp: Path, final: Path) -> None:
    """Rename the folder ``tmp`` to ``final``; an existing ``final`` is replaced, and removed
    only once the new one is in place. ``tmp`` must not be used afterwards."""
    if not final.exists():
        os.replace(tmp, final)
    elif _exchange(tmp, final):
        shutil.rmtree(tmp, ignore_errors=True)  # now the old content
    else:
        # Fallback without RENAME_EXCHANGE: set the old folder aside, rename the new one in, drop
        # the old. Between the two renames (microseconds) ``final`` does not exist; a crash there
        # leaves the old content under ``.<name>.old-<pid>``. If the second rename fails, the
        # old folder is put back.
        old = final.with_name(f".{final.name}.old-{os.getpid()}")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
        try:
            os.replace(tmp, final)
        except BaseException:
            os.replace(old, final)
            raise
        shutil.rmtree(old, ignore_errors=True)
    fsync_dir(final.parent)


def promote(tmp: Path, final: Path, *, fsync: bool = True) -> None:
    """fsync a filled temp folder (unless ``fsync=False``) and swap it in as ``final``; for
    writers that choose the final name only at the end (an export: OUT or OUT.failed)."""
    if fsync:
        fsync_tree(tmp)
    swap_into_place(tmp, final)


@contextlib.contextmanager
def atomic_dir(final: Path, *, fsync: bool = True) -> Iterator[Path]:
    """Yield an empty temp folder beside ``final`` (``.<name>.tmp-<pid>``) to fill; when the
    block ends without an exception, fsync its content (unless ``fsync=False``) and swap it in
    as ``final`` (see ``swap_into_place``). On any exception, the swap included, the temp
    folder is removed and ``final`` is as it was.

    The parent folder is created if needed; a leftover temp folder of this pid is replaced.
    """
    final = Path(final)
    tmp = temp_path(final)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
        yield tmp
        promote(tmp, final, fsync=fsync)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def remove_stale(folder: Path, pattern: str) -> list[Path]:
    """Remove the files and folders in ``folder`` whose names match the glob ``pattern`` (temp
    copies a killed process left, e.g. ``.step-*.tmp-*``); return what was removed."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    removed = []
    for p in sorted(folder.glob(pattern)):
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                p.unlink()
        removed.append(p)
    return removed
