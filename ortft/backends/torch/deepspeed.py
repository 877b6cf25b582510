"""DeepSpeed ZeRO (stages 1 and 2) around the PyTorch engine: DeepSpeed's engine and checkpoints.

The config is checked and completed from the recipe by ``ortft.recipe.deepspeed`` (``check``,
``config``): the recipe stays the one source of truth.

ZeRO stage 3 partitions the parameters themselves; ORTModule's exported graph needs whole
parameters (ORT 1.19 documents stages 1 and 2 with ORTModule), so stage 3 is refused.

Checkpoints: every process writes its ZeRO partition of the optimizer state through DeepSpeed's
own ``save_checkpoint`` into ``step-NNNNNN/deepspeed/``, next to ortft's model.safetensors,
state and RNG (``save_partitions``); a resumed run loads them back through ``load_checkpoint``,
every file with ``torch.load(weights_only=True)`` (``load_partitions``).

On CPU, DeepSpeed runs its CPU accelerator (``DS_ACCELERATOR=cpu``: the engine sets it to the
run's device): its communication backend is oneCCL when ``oneccl_bindings_for_pytorch`` is
importable, else gloo (``accelerator/cpu_accelerator.py``), the process group ortft has joined.

``deepspeed`` itself is imported only when a run uses it (``engine``), never at validation.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from ortft.core.errors import first_line
from ortft.recipe.deepspeed import check, config, read

__all__ = ["FOLDER", "TAG", "check", "config", "engine", "read", "start"]

FOLDER = "deepspeed"  # DeepSpeed's checkpoint inside ortft's step-NNNNNN/
TAG = "zero"  # DeepSpeed's name for it inside FOLDER (one checkpoint per folder)


def start(
    model: Any,
    optimizer: Any,
    scheduler: Any,
    recipe: Any,
    base_dir: Path,
    world: int,
    device: Any,
) -> Any:
    """The engine for ``recipe.deepspeed`` (under torchrun, or in one process: a group of one)."""
    import torch

    from ortft.core.errors import InputError

    if not torch.distributed.is_initialized():  # one process, no torchrun: a group of one
        for key, value in (
            ("RANK", "0"),
            ("LOCAL_RANK", "0"),
            ("WORLD_SIZE", "1"),
            ("LOCAL_WORLD_SIZE", "1"),
        ):
            os.environ.setdefault(key, value)  # what DeepSpeed reads; torchrun sets them otherwise
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        torch.distributed.init_process_group(
            backend, store=torch.distributed.HashStore(), rank=0, world_size=1
        )
    try:
        cfg = config(read(recipe.deepspeed, base_dir), recipe, world)
    except ValueError as err:
        raise InputError(f"deepspeed: {err}") from None
    return engine(model, optimizer, scheduler, cfg, device.type)


def _check_accelerator(deepspeed: Any, device_type: str) -> None:
    """DeepSpeed's accelerator must be the run's device (the engine set DS_ACCELERATOR to it
    before anything imported DeepSpeed; DeepSpeed would pick CUDA whenever a GPU is visible).
    Its logger writes to stdout, where ortft's results go: stderr instead."""
    import logging
    import sys

    from ortft.core.errors import BackendError

    for handler in deepspeed.utils.logger.handlers:
        if isinstance(handler, logging.StreamHandler):
            handler.setStream(sys.stderr)
    name = deepspeed.accelerator.get_accelerator().device_name()
    if name != device_type:
        raise BackendError(
            f"DeepSpeed's accelerator is {name} but this run's device is {device_type} "
            f"(DeepSpeed was imported before DS_ACCELERATOR={device_type} was set)"
        )


def _skip_shm_comm(deepspeed: Any) -> None:
    """Mark DeepSpeed's CPU shared-memory all-reduce op as unavailable. Its communication backend
    compiles that op with the C++ compiler when it starts (~60 s on 2 cores, once per machine),
    yet only ``inference_all_reduce`` (tensor-parallel inference) uses it: ZeRO's reductions go
    through torch.distributed (gloo). DeepSpeed keeps this table to be edited: its comment in
    ``deepspeed/ops/__init__.py`` says "edits to it persist"."""
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def engine(
    model: Any, optimizer: Any, scheduler: Any, cfg: dict[str, Any], device_type: str
) -> Any:
    """``deepspeed.initialize``: the engine that does backward, accumulation, clipping and step."""
    from ortft.core.errors import BackendError

    try:
        import deepspeed
    except Exception as err:  # noqa: BLE001 - ImportError, or a build/accelerator problem at import
        raise BackendError(
            f"recipe sets deepspeed but DeepSpeed cannot be imported ({type(err).__name__}: "
            f"{str(err).strip()[:200]}); `make setup` installs it (requirements/deepspeed.txt "
            "says how it builds)"
        ) from None
    _check_accelerator(deepspeed, device_type)
    _skip_shm_comm(deepspeed)
    try:
        eng, *_ = deepspeed.initialize(
            model=model,
            optimizer=optimizer,
            lr_scheduler=scheduler,
            config=cfg,
            dist_init_required=False,
        )
    except Exception as err:  # noqa: BLE001 - no accelerator, unsupported op set, ...
        raise BackendError(
            f"DeepSpeed could not start ({type(err).__name__}: {first_line(err)})"
        ) from None
    return eng


def own_storage(model: Any) -> None:
    """Each parameter in a storage of its own again, once the engine is done: ZeRO 1/2 made them
    views of one flat buffer, which ``save_pretrained`` (safetensors) refuses to write. A tied
    parameter is one object, so it stays tied."""
    for p in model.parameters():
        p.data = p.data.clone()


def save_partitions(eng: Any, run_dir: Path, step: int) -> Path:
    """Every process: its ZeRO partition (and, on rank 0, DeepSpeed's model and scheduler states)
    into a folder beside the run's checkpoints, named alike on every rank (a temp name that a
    kill leaves behind for the next run to remove). Returns that folder, complete on every rank."""
    import shutil

    import torch

    folder = run_dir / f".{FOLDER}-{step:06d}.tmp-ranks"
    if torch.distributed.get_rank() == 0:
        shutil.rmtree(folder, ignore_errors=True)  # a step saved twice (signal after a save)
    torch.distributed.barrier()
    # DeepSpeed's own barriers: rank 0 creates the folder first; "latest" is not needed (TAG)
    eng.save_checkpoint(str(folder), tag=TAG, save_latest=False)
    torch.distributed.barrier()  # every partition is on disk before rank 0 moves the folder
    return folder


def load_partitions(eng: Any, checkpoint_dir: Path) -> None:
    """Optimizer partitions, scheduler and DeepSpeed's counters from ``checkpoint_dir/deepspeed``
    (the weights too, the same as model.safetensors), every file with weights_only=True."""
    from ortft.core.errors import InputError

    # DeepSpeed's TorchCheckpointEngine.load calls torch.load(weights_only=False)
    eng.checkpoint_engine.load = _load_weights_only
    where = checkpoint_dir / FOLDER
    try:
        path, _ = eng.load_checkpoint(
            str(where), tag=TAG, load_optimizer_states=True, load_lr_scheduler_states=True
        )
    except Exception as err:  # noqa: BLE001 - unpickling refused, a missing partition, ...
        text = re.sub(r"\x1b\[[0-9;]*m", "", str(err)).strip()  # torch's message has colours
        first = text.splitlines()[0] if text else type(err).__name__
        raise InputError(f"{where}: DeepSpeed could not load it ({first[:300]})") from None
    if path is None:  # DeepSpeed logs a warning and returns None for a missing checkpoint
        raise InputError(f"{where}: no DeepSpeed checkpoint (tag {TAG})")


def _load_weights_only(path: str, map_location: Any = None) -> Any:
    """``torch.load(weights_only=True)`` with the few DeepSpeed classes its files hold allowed
    (found by loading fp32 ZeRO 1 and 2 checkpoints of DeepSpeed 0.19.8): unpickling can build
    those and plain data, and run nothing else."""
    import torch

    with torch.serialization.safe_globals(_safe_globals()):
        return torch.load(path, map_location=map_location, weights_only=True)


def _safe_globals() -> list[Any]:
    """What a ZeRO 1/2 optimizer partition holds besides tensors and plain containers: its loss
    scaler, the stage enum, and where each parameter's fragment lies (the model-states file
    needs none). DynamicLossScaler is fp16's (DeepSpeed's own class for it), not measured here:
    CPU runs are fp32."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [LossScaler, DynamicLossScaler, ZeroStageEnum, fragment_address]


def partition_problem(checkpoint_dir: Path, world: int) -> str | None:
    """Why ``checkpoint_dir`` cannot resume a DeepSpeed run of ``world`` processes, or None:
    ZeRO 1/2 keep one optimizer partition per process, so the process count must match."""
    written = len(list((checkpoint_dir / FOLDER / TAG).glob("*zero_pp_rank_*_optim_states.pt")))
    if written and written != world:  # stage 0 writes no partitions
        return (
            f"its DeepSpeed optimizer state is partitioned over {written} processes, this run "
            f"has {world}; resume with {written} processes"
        )
    return None
