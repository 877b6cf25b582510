"""hardware.heap: under glibc a CPU run's process keeps the memory it frees (ortft.env.heap)."""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest

from ortft.env import heap

GLIBC = platform.libc_ver()[0] == "glibc"

# In a fresh process: a 64 MB block malloc'd and freed before and after ``heap.keep`` (or not),
# with glibc's own account of it (mallinfo2, glibc 2.33+): the bytes in blocks mapped on their
# own while it is held, and the heap's size once it is freed.
PROBE = """
import ctypes, json, sys
from ortft.env import heap

class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]

def block(n=64 << 20):
    p = libc.malloc(n)
    ctypes.memset(p, 1, n)  # touched, as a tensor's pages are
    mapped = libc.mallinfo2().hblkhd
    libc.free(p)
    return {"mapped": mapped, "heap_after_free": libc.mallinfo2().arena}

before = block()
said = heap.keep() if sys.argv[1] == "keep" else None
print(json.dumps({"before": before, "after": block(), "said": said}))
"""


def _probe(mode: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


@pytest.mark.skipif(not GLIBC, reason="mallopt and mallinfo2 are glibc's")
def test_keep_serves_large_blocks_from_a_heap_it_never_trims() -> None:
    block = 64 << 20
    plain, kept = _probe("plain"), _probe("keep")
    # glibc's defaults: the block is mapped on its own, and unmapped when freed
    for seen in (plain["before"], plain["after"], kept["before"]):
        assert seen["mapped"] >= block and seen["heap_after_free"] < block
    assert plain["said"] is None
    # kept: the block comes from the heap, and the heap keeps it once freed
    assert kept["said"] == heap.KEPT
    assert kept["after"]["mapped"] < block <= kept["after"]["heap_after_free"]


def test_the_device_keeps_the_heap_on_a_cpu_unless_the_recipe_says_system() -> None:
    from ortft.backends.torch import device
    from ortft.recipe.schema import HardwareSection

    auto = device.resolve(HardwareSection(device="cpu", threads=1))
    assert auto.heap == (heap.KEPT if GLIBC else heap.SYSTEM)
    assert device.resolve(HardwareSection(device="cpu", threads=1, heap="system")).heap == "system"
