"""Device, threads and seeds: resolved once per run, logged with the reason for each choice."""

from __future__ import annotations

import logging
import os
import random
from dataclasses import dataclass

import numpy as np
import torch

from ortft.errors import InputError
from ortft.recipe import HardwareSection

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
    threads = hw.threads or (os.cpu_count() or 1)
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
