"""Device, threads and seeds: resolved once per run, logged with the reason for each choice."""

from __future__ import annotations

import logging
import os
import random
from dataclasses import dataclass

import numpy as np
import torch

from ortft.core.errors import InputError
from ortft.recipe.schema import HardwareSection

log = logging.getLogger("ortft")


@dataclass(frozen=True)
class Runtime:
    device: torch.device
    threads: int
    reason: str


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
    return Runtime(device=device, threads=threads, reason=reason)


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


def check_precision(dtype: str, backend: str, device: torch.device) -> None:
    """What the recipe could not know before the device was resolved (hardware.device=auto).

    Measured on CPU (torch 2.6, ORT 1.19.2): bf16 autocast trains on the torch backend; ORT's
    CPU provider has no bf16 MatMul, so bf16 on the ort backend fails; fp16 training on CPU is
    not supported. Never a silent fp32 run instead.
    """
    if device.type != "cpu" or dtype == "fp32":
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


def autocast(dtype: str, device: torch.device) -> torch.autocast:
    """The forward's autocast context (disabled for fp32); a fresh one per forward."""
    amp = AMP_DTYPES[dtype]
    return torch.autocast(device.type, dtype=amp or torch.bfloat16, enabled=amp is not None)
