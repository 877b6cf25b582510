"""Device, threads and seeds: resolved once per run, logged with the reason for each choice."""

from __future__ import annotations

import logging
import os
import random
from dataclasses import dataclass

import numpy as np
import torch

from ortft.core.errors import InputError
from ortft.env import heap as process_heap
from ortft.recipe.schema import HardwareSection

log = logging.getLogger("ortft")


@dataclass(frozen=True)
class Runtime:
    device: torch.device
    threads: int
    reason: str
    heap: str = process_heap.SYSTEM  # hardware.heap as applied (``process_heap.keep``)


def resolve(hw: HardwareSection) -> Runtime:
    cuda = torch.cuda.is_available()
    if hw.device == "cuda" and not cuda:
        raise InputError("hardware.device=cuda but no CUDA GPU is visible; use auto or cpu")
    if hw.device == "auto":
        device = torch.device("cuda" if cuda else "cpu")
        reason = "auto: a CUDA GPU is visible" if cuda else "auto: no CUDA GPU visible"
    else:
        device = torch.device(hw.device)
        reason = "hardware.device"
    # under torchrun the processes of one machine share its cores
    threads = hw.threads or max(
        1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    )
    torch.set_num_threads(threads)
    # ORT's CPU provider sizes its thread pool from OMP_NUM_THREADS when it is set
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    heap = (
        process_heap.keep() if hw.heap == "auto" and device.type == "cpu" else process_heap.SYSTEM
    )
    return Runtime(device=device, threads=threads, reason=reason, heap=heap)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def make_deterministic() -> None:
    """training.deterministic: deterministic kernels in torch, and ORTModule told so.

    ORTModule reads torch's flag when it is imported, so this runs before the backend loads.
    What stays nondeterministic across machines: thread counts (reduction order) and
    ORT's kernel choices on another CPU; on one machine, runs repeat exactly.
    """
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    # ORTModule copies this flag (ORTMODULE_IS_DETERMINISTIC) when it is first imported
    torch.use_deterministic_algorithms(True)


AMP_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_precision(dtype: str, backend: str, device: torch.device) -> tuple[str, str | None]:
    """``precision.dtype: auto`` made concrete for this device and backend, with the reason
    (None for a dtype the recipe set). bf16 only where the hardware runs it natively, and never
    on ``ort`` on CPU: ONNX Runtime 1.19's CPU provider has no bf16 training kernels."""
    from ortft.env import hardware

    if dtype != "auto":
        return dtype, None
    if backend == "ort-ondevice":
        return "fp32", "ort-ondevice trains in fp32 only"
    if device.type == "cuda":
        cc = torch.cuda.get_device_capability(device)
        name = f"compute capability {cc[0]}.{cc[1]}"
        if hardware.cuda_bf16(cc):
            return "bf16", f"auto: this GPU ({name}) runs bf16 natively"
        return "fp32", f"auto: this GPU ({name}) has no native bf16 (8.0 or newer has)"
    flags = hardware.cpu_bf16()
    if not flags:
        return "fp32", "auto: this CPU has no avx512_bf16 or AMX, so bf16 would be emulated"
    if backend == "ort":
        return "fp32", (
            f"auto: this CPU has {flags[0]}, but ONNX Runtime's CPU provider has no bf16 "
            "training kernels (backend.name=torch trains in bf16 here)"
        )
    return "bf16", f"auto: this CPU has {flags[0]} (bf16 in hardware)"


def check_precision(dtype: str, backend: str, device: torch.device) -> None:
    """What the recipe could not know before the device was resolved (hardware.device=auto).

    Measured on CPU (torch 2.6, ORT 1.19.2): bf16 autocast trains on the torch backend; ORT's
    CPU provider has no bf16 MatMul, so bf16 on the ort backend fails; fp16 training on CPU is
    not supported. Never a silent fp32 run instead.
    """
    if device.type != "cpu" or dtype in ("fp32", "auto"):  # auto: resolve_precision first
        return
    if dtype == "fp16":
        raise InputError(
            "precision.dtype=fp16 needs a CUDA GPU (none is visible); "
            "use bf16 (backend.name=torch) or fp32 on cpu"
        )
    if backend == "ort":
        raise InputError(
            "precision.dtype=bf16 with backend.name=ort needs a CUDA GPU: ONNX Runtime's "
            "CPU provider has no bf16 MatMul; use backend.name=torch or fp32 on cpu"
        )


def check_optimizer(name: str, device: torch.device) -> None:
    """``adamw_ort_fused`` where ORT's ``fused_ops`` extension is built (it needs a CUDA 12
    nvcc, which set-up does not have), checked when the run starts: validation may run on
    another machine. The alternative named is torch's own fused AdamW, the same kind of
    multi-tensor kernel on CUDA."""
    if name != "adamw_ort_fused":
        return
    if device.type != "cuda":  # hardware.device=auto that resolved to cpu (rules catch `cpu`)
        raise InputError(
            f"optimizer.name=adamw_ort_fused needs CUDA, and this run is on {device.type}; "
            "use optimizer.name=adamw"
        )
    from ortft.env import cuda_extensions, extensions

    if extensions.built_file("fused_ops") is None:
        raise InputError(
            "optimizer.name=adamw_ort_fused: ORT's fused_ops extension is not built here (it "
            "needs a CUDA 12 nvcc: docs/gpu.md); use optimizer.name=adamw "
            f"optimizer.implementation=fused, or build it: {cuda_extensions.FUSED_OPS_COMMAND}"
        )


def autocast(dtype: str, device: torch.device) -> torch.autocast:
    """The forward's autocast context (disabled for fp32); a fresh one per forward."""
    amp = AMP_DTYPES[dtype]
    return torch.autocast(device.type, dtype=amp or torch.bfloat16, enabled=amp is not None)
