"""What the machine runs natively: the facts ``precision.dtype: auto`` and ``ortft doctor`` read.

bf16 is native on a CPU with AVX-512 BF16 (``avx512_bf16``: AMD Zen 4+, Intel Cooper Lake /
Sapphire Rapids) or AMX (``amx_bf16``: Intel Sapphire Rapids+), and on NVIDIA GPUs of compute
capability 8.0 (Ampere) or newer. Elsewhere torch emulates it through fp32, which is slower than
fp32 itself. Measured on this 2-core AMD EPYC (avx512_bf16): torch bf16 autocast trains MiniLM
2.3x faster than torch fp32 (issue 29's table; `make bench-peer`).
"""

from __future__ import annotations

from pathlib import Path

CPU_BF16_FLAGS = ("amx_bf16", "avx512_bf16")  # either one: bf16 dot products in hardware
CUDA_BF16_CAPABILITY = (8, 0)


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    """The first CPU's feature flags (Linux); empty when they cannot be read."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags") and ":" in line:
            return set(line.split(":", 1)[1].split())
    return set()


def cpu_bf16(flags: set[str] | None = None) -> list[str]:
    """The flags that make bf16 native on this CPU (empty: it is emulated)."""
    found = cpu_flags() if flags is None else flags
    return [flag for flag in CPU_BF16_FLAGS if flag in found]


def cuda_bf16(capability: tuple[int, int]) -> bool:
    return tuple(capability) >= CUDA_BF16_CAPABILITY
