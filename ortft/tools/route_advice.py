"""``ortft doctor``'s route advice: which training route was measured faster on a CPU of this
machine's class, in fp32 and in bf16, and the override that picks it.

A CPU's class is what multiplies bf16 in hardware: AMX (``amx_bf16``, Intel Sapphire Rapids and
later), AVX-512 BF16 (``avx512_bf16`` alone: AMD Zen 4 and later, Intel Cooper Lake) or neither
(``ortft.env.hardware`` reads the flags). The advice is ``MEASURED``: figures from
docs/backends.md, each naming its machine, date and command. Where nothing was measured (a CPU
without bf16 units, or a vendor other than the measured machine's) the line says so and points
at ``backend.name=auto``, which times the routes on the run's own first batches; it never
presents a guess as a measurement. The cached matmul limit (``limit.py``) is not used: it times
PyTorch's GEMMs only, not ORT's.
"""

from __future__ import annotations

from dataclasses import dataclass

from ortft.env import hardware
from ortft.tools.doctor_verdicts import INFO, Check

AMX, AVX512_BF16, NO_BF16 = "AMX", "AVX-512 BF16", "no bf16 units"
SOURCE = "docs/backends.md"
AUTO = (
    "backend.name=auto precision.dtype=auto precision.weights=auto times torch (in bf16, fp32 "
    "and with bf16 weights) and ort on the run's first batches"
)


@dataclass(frozen=True)
class Measured:
    """The faster route for one precision on one class of CPU, as measured on ``machine``."""

    pick: str  # the recipe overrides that select it
    figures: str  # the measured comparison behind the advice
    machine: str  # the CPU, its load and the date
    command: str
    vendor: str  # the measured CPU's vendor as /proc/cpuinfo names it (AMD, Intel)


PEER = "benchmarks/peer.py (MiniLM, batch 16, max_length 128)"
PEERS = "benchmarks/peers.py (make bench-peers: every task's peer bench)"
INTEL_AMX = "2 cores of an Intel Xeon with AMX, quiet"
AMD_ZEN4 = "2 cores of an AMD EPYC (Zen 4, avx512_bf16)"
# the bf16 pick on both measured classes: a bf16 copy of the weights, fp32 masters
BF16_WEIGHTS = "backend.name=torch precision.dtype=bf16 precision.weights=bf16"

MEASURED: dict[str, dict[str, Measured]] = {
    AMX: {
        "fp32": Measured(
            "backend.name=torch",
            "torch fp32 1.80x ort fp32 on short texts (59.0 vs 32.8 samples/s), "
            "1.11x on long ones (20.5 vs 18.4)",
            f"{INTEL_AMX}, 2026-12-04 (short) and 2026-12-02 (long)",
            PEER,
            "Intel",
        ),
        "bf16": Measured(
            BF16_WEIGHTS,
            "a bf16 copy of the weights (fp32 masters) the fastest fixed route on 6 of 8 tasks, "
            "1.04-1.10x torch autocast bf16: short texts 94.7 vs 85.9 samples/s, speech 87.6 vs "
            "79.5, embeddings 80.2 vs 73.2, images, DPO, text-to-image; level on long texts "
            "(46.6 vs 47.0); the tiny VLM ran fastest compiled in fp32. Autocast bf16 itself "
            "ran 1.48x torch fp32 on short texts (87.4 vs 59.0, 2026-12-04)",
            f"{INTEL_AMX}, torch 2.13, 2026-12-07",
            PEERS,
            "Intel",
        ),
    },
    AVX512_BF16: {
        # the routes and the tasks disagree, so the advice is the probe that measures the run's own
        "fp32": Measured(
            "backend.name=auto (no single answer)",
            "on a Zen 4, one round of every task (torch 2.6): ortft's torch fp32 (padding "
            "skipped) 1.66x ort fp32 on short texts (49.9 vs 30.1 samples/s), and ort with "
            "backend.unpad 1.84x itself padded (55.3: 1.11x torch fp32); elsewhere within "
            "0.96-1.12x of each other (ort ahead on long texts, images, speech, DPO, "
            "text-to-image and the tiny VLM, behind on embeddings), inside the spread between "
            "processes; on an older AVX-512 VM ort fp32 ran 1.59x torch fp32 on short texts "
            "(55.5 vs 34.9, before backend.unpad)",
            f"{AMD_ZEN4}, quiet, 2026-12-07; an AMD EPYC VM with AVX-512, 2026-12-01 (CPU model "
            "not recorded)",
            f"{PEERS} and {PEER}",
            "AMD",
        ),
        "bf16": Measured(
            BF16_WEIGHTS,
            "torch bf16 ran 1.17-2.92x ort fp32 on every task (torch 2.6, one round); a bf16 "
            "copy of the weights (fp32 masters) 1.07-1.13x torch autocast bf16 on short and "
            "long texts, embeddings, DPO and text-to-image (torch 2.13, 2 rounds: short texts "
            "86.3 vs 80.3 samples/s, long 30.9 vs 27.4); autocast ahead on images (1.09x), "
            "speech (1.03x) and the tiny VLM (1.13x, 1086.3 vs 960.7); a second table that "
            "night flipped images (bf16 weights 1.12x) and embeddings (autocast 1.09x): across "
            "the two, bf16 weights held on long texts (1.12-1.13x), autocast on the tiny VLM "
            "(1.13-1.25x), the rest moved inside this CPU's level changes (backend.name=auto "
            "precision.weights=auto times both on your model)",
            f"{AMD_ZEN4}, quiet, 2026-12-07 evening and night",
            PEERS,
            "AMD",
        ),
    },
}


def cpu_class(flags: set[str]) -> str:
    found = hardware.cpu_bf16(flags)
    if "amx_bf16" in found:
        return AMX
    return AVX512_BF16 if found else NO_BF16


def vendor(model: str) -> str | None:
    for name in ("Intel", "AMD"):
        if name.lower() in model.lower():
            return name
    return None


def advice(model: str, flags: set[str]) -> list[Check]:
    """The doctor's lines for a CPU of ``model`` with ``flags``: its class, then the route
    measured faster in fp32 and in bf16 on a CPU of that class (or that none was)."""
    kind = cpu_class(flags)
    units = ", ".join(hardware.cpu_bf16(flags)) or "neither amx_bf16 nor avx512_bf16"
    checks = [Check("cpu class", INFO, f"{kind} ({units})")]
    for dtype in ("fp32", "bf16"):
        checks.append(_route_line(kind, dtype, vendor(model)))
    return checks


def _route_line(kind: str, dtype: str, found_vendor: str | None) -> Check:
    name = f"cpu {dtype} route"
    if kind == NO_BF16 and dtype == "bf16":
        value = (
            "none: this CPU has no bf16 units, so bf16 is emulated through fp32 (not measured by "
            "ortft); train fp32 (precision.dtype=auto keeps it)"
        )
        return Check(name, INFO, value)
    measured = MEASURED.get(kind, {}).get(dtype)
    if measured is None:
        value = f"not measured on a CPU of this class ({kind}); {AUTO} and trains with the faster"
        return Check(name, INFO, value)
    value = (
        f"{measured.pick}: {measured.figures}; measured on {measured.machine}, "
        f"{measured.command} ({SOURCE})"
    )
    if found_vendor != measured.vendor:
        value += (
            f"; measured on an {measured.vendor} CPU, not on this vendor's: {AUTO}, "
            "which checks it here"
        )
    return Check(name, INFO, value)
