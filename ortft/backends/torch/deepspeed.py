"""DeepSpeed ZeRO (stages 1 and 2): the recipe's ``deepspeed:`` config, checked and completed.

The recipe stays the one source of truth: batch sizes, accumulation, clipping and precision
come from it, and a DeepSpeed config that says otherwise is a recipe error (``check``), not a
silent override. ``config`` fills the values DeepSpeed needs (``"auto"`` or absent) from the
recipe and the world size. ortft builds the optimizer and scheduler itself, so a config with
its own ``optimizer``/``scheduler`` is refused.

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

import json
import os
import re
from pathlib import Path
from typing import Any

STAGES = (0, 1, 2)
FOLDER = "deepspeed"  # DeepSpeed's checkpoint inside ortft's step-NNNNNN/
TAG = "zero"  # DeepSpeed's name for it inside FOLDER (one checkpoint per folder)


def read(value: str | dict[str, Any], base_dir: Path) -> dict[str, Any]:
    """The config mapping: inline, or read from a JSON file (relative to the recipe)."""
    if isinstance(value, dict):
        return value
    path = Path(value) if Path(value).is_absolute() else base_dir / value
    try:
        data = json.loads(path.read_text())
    except OSError as err:
        raise ValueError(f"cannot read {path}: {err.strerror or err}") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not JSON ({err})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a JSON object is needed")
    return data


def _given(cfg: dict[str, Any], key: str) -> Any:
    value = cfg.get(key)
    return None if value == "auto" else value


def check(cfg: dict[str, Any], recipe: Any, world: int | None = None) -> list[str]:
    """Every way ``cfg`` disagrees with ``recipe`` (and, when known, the world size)."""
    t, problems = recipe.training, []
    if recipe.backend.name not in ("ort", "torch"):
        problems.append(f"needs backend.name=ort or torch, not {recipe.backend.name}")
    zero = cfg.get("zero_optimization", {})
    stage = zero.get("stage", 0) if isinstance(zero, dict) else None
    if stage not in STAGES:
        problems.append(
            f"zero_optimization.stage={stage}: ortft supports ZeRO stages 0, 1 and 2 "
            "(stage 3 partitions parameters, which ORTModule cannot export)"
        )
    micro = _given(cfg, "train_micro_batch_size_per_gpu")
    if micro is not None and micro != t.batch_size:
        problems.append(
            f"train_micro_batch_size_per_gpu={micro} but training.batch_size={t.batch_size}"
        )
    gas = _given(cfg, "gradient_accumulation_steps")
    if gas is not None and gas != t.gradient_accumulation_steps:
        problems.append(
            f"gradient_accumulation_steps={gas} but training.gradient_accumulation_steps="
            f"{t.gradient_accumulation_steps}"
        )
    total, per_rank = _given(cfg, "train_batch_size"), t.batch_size * t.gradient_accumulation_steps
    if total is not None:
        if world is not None and total != per_rank * world:
            problems.append(
                f"train_batch_size={total} but batch_size x accumulation x world size = "
                f"{t.batch_size} x {t.gradient_accumulation_steps} x {world} = {per_rank * world}"
            )
        elif total % per_rank:
            problems.append(
                f"train_batch_size={total} is not a multiple of batch_size x accumulation "
                f"({per_rank})"
            )
    clip = _given(cfg, "gradient_clipping")
    if clip is not None and clip != (t.max_grad_norm or 0.0):
        problems.append(f"gradient_clipping={clip} but training.max_grad_norm={t.max_grad_norm}")
    for key in ("fp16", "bf16"):
        enabled = (cfg.get(key) or {}).get("enabled", False)
        if enabled not in (False, "auto") and recipe.precision.dtype != key:
            problems.append(f"{key}.enabled but precision.dtype={recipe.precision.dtype}")
    for key in ("optimizer", "scheduler"):
        if key in cfg:
            problems.append(
                f"{key}: ortft builds the {key} from the recipe; remove it from the config"
            )
    return problems


def config(cfg: dict[str, Any], recipe: Any, world: int) -> dict[str, Any]:
    """``cfg`` completed from the recipe (raises ValueError on a disagreement)."""
    problems = check(cfg, recipe, world)
    if problems:
        raise ValueError("; ".join(problems))
    t, dtype = recipe.training, recipe.precision.dtype
    out = json.loads(json.dumps(cfg))  # a deep copy
    out["train_micro_batch_size_per_gpu"] = t.batch_size
    out["gradient_accumulation_steps"] = t.gradient_accumulation_steps
    out["train_batch_size"] = t.batch_size * t.gradient_accumulation_steps * world
    out["gradient_clipping"] = t.max_grad_norm or 0.0
    out["fp16"] = {**(cfg.get("fp16") or {}), "enabled": dtype == "fp16"}
    out["bf16"] = {**(cfg.get("bf16") or {}), "enabled": dtype == "bf16"}
    out.setdefault("zero_optimization", {"stage": 0})
    out.setdefault(
        "zero_allow_untested_optimizer", True
    )  # ortft's torch AdamW, not a DeepSpeed one
    out.setdefault("steps_per_print", 10**9)  # ortft logs; DeepSpeed stays quiet
    return out


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
            f"DeepSpeed could not start ({type(err).__name__}: "
            f"{str(err).strip().splitlines()[0][:300]})"
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
