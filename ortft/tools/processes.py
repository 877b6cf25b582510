"""A bench's run in a fresh process, waited for with ``wait4``: its exit code and its own
resource usage (its peak resident memory), which ``subprocess.run`` does not give
(``ortft bench``, and benchmarks/peer_common.py for the peer benches)."""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Mapping
from typing import IO, Any


def run_to_end(
    cmd: list[str], env: Mapping[str, str], out: IO[Any], err: IO[Any], timeout: float
) -> tuple[int, Any]:
    """Run ``cmd`` with its stdout and stderr in ``out`` and ``err`` (open files) until it ends,
    killed at ``timeout`` seconds (exit code -9); its exit code and ``resource.struct_rusage``
    (``ru_maxrss``: the peak RSS in KiB of it and of the children it waited for)."""
    proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=dict(env))
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    try:
        _, status, usage = os.wait4(proc.pid, 0)
    finally:
        timer.cancel()
    proc.returncode = os.waitstatus_to_exitcode(status)  # so Popen does not wait for it again
    return proc.returncode, usage
