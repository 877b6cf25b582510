"""``hardware.heap``: a CPU training process keeps the memory it frees, for the next step.

glibc's malloc serves a large block with a mapping of its own and unmaps it when the block is
freed (every block of 32 MB or more, and smaller ones until its threshold has grown), and it
hands free memory at the top of its heap back to the kernel. A training step frees nearly all it
allocated (activations, gradients, their casts), so under those defaults the next step maps the
same memory again and faults in every page on first touch, zero-filled by the kernel. MiniLM's
word-embedding gradient ([30522, 384] fp32, 47 MB) is mapped, faulted in and unmapped twice a
step of the sentence-embedding task.

``keep`` turns both off through ``mallopt``: no block gets its own mapping and the heap is never
trimmed, so a step reuses pages the steps before touched. The peak RSS stayed within 3% on the
peer benches (docs/backends.md); what changes is that the RSS stays at its peak until the
process ends, where glibc would have returned some memory between steps.

Torch-free (ctypes): ``ortft validate`` and the doctor import nothing heavier.
"""

from __future__ import annotations

import ctypes
import platform

# glibc's malloc.h
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
KEPT = "kept (glibc mallopt: no per-block mmap, no trimming)"
SYSTEM = "system"


def keep() -> str:
    """Tell glibc's malloc to keep what this process frees (module docstring). What applied:
    ``KEPT`` when it took both settings; ``SYSTEM`` where the C library is not glibc (musl,
    macOS, Windows), which has no such settings, or refused one."""
    if platform.libc_ver()[0] != "glibc":
        return SYSTEM
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return SYSTEM
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    # mallopt returns 1 on success; -1 as the trim threshold turns trimming off (mallopt(3))
    if mallopt(M_MMAP_MAX, 0) != 1 or mallopt(M_TRIM_THRESHOLD, -1) != 1:
        return SYSTEM
    return KEPT
