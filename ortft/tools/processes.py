"""A bench's run in a fresh process: its exit code and its own peak resident memory
(``ortft bench``, and benchmarks/peer_common.py for the peer benches).

The peak is the kernel's high-water mark of the process's memory (``VmHWM`` in
``/proc/PID/status``), read while it runs. ``wait4``'s ``ru_maxrss`` is not the child's own: exec
carries the parent's peak into it (a 10 MB ``print`` started from a process holding torch read
619 MB), so a bench that has imported torch would report its own size for every small run.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

POLL_S = 0.05  # a peak reached in the run's last POLL_S seconds is missed


def run_to_end(
    cmd: list[str], env: Mapping[str, str], out: IO[Any], err: IO[Any], timeout: float
) -> tuple[int, float]:
    """Run ``cmd`` with its stdout and stderr in ``out`` and ``err`` (open files) until it ends,
    killed at ``timeout`` seconds (exit code -9); its exit code and its peak RSS in MiB."""
    proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=dict(env))
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    peak_kb = 0
    try:
        while True:
            pid, status, _ = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            peak_kb = max(peak_kb, high_water_kb(proc.pid))
            time.sleep(POLL_S)
    finally:
        timer.cancel()
    proc.returncode = os.waitstatus_to_exitcode(status)  # so Popen does not wait for it again
    return proc.returncode, peak_kb / 1024


def high_water_kb(pid: int) -> int:
    """The process's peak resident set so far (kB), 0 where /proc does not tell it."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0  # a zombie: its memory is gone, its last reading stands
