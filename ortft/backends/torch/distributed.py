"""Data-parallel training under torchrun: process group setup/teardown and rank logic.

torchrun (``python -m torch.distributed.run``) starts one process per device and sets RANK,
WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE and the rendezvous address in each one's environment.
This module reads them; it launches nothing and talks only through ``torch.distributed``.
Without torchrun (no WORLD_SIZE) every helper is the single-process identity.

How the loop uses it: every rank draws the same seeded permutation of the data with the
*global* batch (batch_size × world size) and keeps its slice (``shard``), so a run on N
processes sees the same examples per step as one process with that global batch; DDP
averages the gradients; ``all_reduce_mean`` averages the logged loss. Only rank 0 logs,
writes checkpoints, final/, the export and summary.json.

Shutdown (``teardown``) joins the group's worker threads while the interpreter is still whole;
see its docstring for why ``destroy_process_group`` alone does not.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import weakref
from typing import Any

import numpy as np
import torch

log = logging.getLogger("ortft")


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def is_main() -> bool:
    """Rank 0: the one process that logs and writes files (true without torchrun)."""
    return rank() == 0


def active() -> bool:
    """More than one process, in a process group."""
    return (
        world_size() > 1 and torch.distributed.is_available() and torch.distributed.is_initialized()
    )


def setup(device: torch.device) -> torch.device:
    """Join the process group (gloo on CPU, nccl on CUDA); return this rank's device.

    A no-op without torchrun (a group of one under `torchrun --nproc_per_node 1`, which DeepSpeed
    needs). Ranks other than 0 stay quiet: their log lines would repeat rank 0's.
    """
    if "WORLD_SIZE" not in os.environ:
        return device
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    if not torch.distributed.is_initialized():
        # torch.distributed.nn.functional binds `group.WORLD` as default arguments when it is
        # imported; DDP's constructor imports it (through torch._dynamo), so imported after
        # init_process_group it would hold the group until interpreter exit, out of teardown's
        # reach. Imported here, before the group exists, its defaults are None (4 ms).
        import torch.distributed.nn as _dist_nn  # noqa: F401  (binds no local `torch`)

        if _restarts_share_a_store() and os.environ.get("RANK") == "0":
            log.warning(
                "torchrun --max-restarts with the rendezvous store shared across rounds: a "
                "restart can hang (pytorch#135712); set TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 "
                "for torchrun, as examples/cluster/ does"
            )
        # env:// rendezvous: MASTER_ADDR/MASTER_PORT (or torchrun's c10d store) from the environment
        torch.distributed.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
        # a failed run too leaves the group before interpreter finalization; no barrier there
        # (another rank may have died or be stuck in a collective)
        atexit.register(teardown, ok=False)
    if not is_main():
        from ortft.core import progress

        progress._console.quiet = True  # log lines and progress: rank 0 only
        log.setLevel(logging.ERROR)
    log.info(
        "distributed: %d processes (%s), global batch = batch_size x accumulation x %d",
        world_size(),
        torch.distributed.get_backend(),
        world_size(),
    )
    return device


def _restarts_share_a_store() -> bool:
    """torchrun may restart the workers, and its agents hand every round's workers the first
    round's store (torch 2.6's default): restarted workers can read the previous round's keys."""
    restarts = int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0)
    return restarts > 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"


# every DDP wrapper wrap() made that is still alive: teardown takes the group out of them
_wrappers: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()


def teardown(ok: bool = True) -> None:
    """Leave the process group for good, its worker threads joined, before the interpreter exits.

    Why: a gloo worker thread can hold the last reference to a tensor whose Python object died
    first (the tensor of the last all_reduce, freed by the caller while the worker is still
    finishing the op: seen in 2 of 16 all_reduces on 2 busy cores). Freeing it takes the GIL;
    if the main thread has begun interpreter finalization by then, Python ends the worker thread
    (pthread_exit) inside a C++ destructor and the process aborts: "terminate called without
    an active exception", SIGABRT, after a run that trained fine. destroy_process_group alone
    does not stop the workers while DDP's Reducer (or anything else) still holds the group.

    In order: every rank at a barrier (ok=True; on an error path another rank may never come),
    the group taken out of the DDP wrappers, destroy_process_group, then the last reference to
    each backend dropped: its destructor joins the worker threads with the GIL released (torch
    holds backends in a no-GIL destructor), so a worker freeing a tensor can still take the GIL.
    (Were the group itself the last reference, its destructor would join holding the GIL: such
    a worker would wait forever.) Safe to call twice; the DDP wrappers must not run afterwards.
    """
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return
    if ok:
        barrier()
    for ddp in list(_wrappers):
        _release(ddp)
    group = torch.distributed.distributed_c10d._get_default_group()
    backends = []
    for device_type in ("cpu", "cuda"):
        with contextlib.suppress(RuntimeError):  # no backend for that device in this group
            backends.append(group._get_backend(torch.device(device_type)))
    del group
    torch.distributed.destroy_process_group()
    backends.clear()  # the last references: ~ProcessGroupGloo joins its threads here


def _release(ddp: torch.nn.Module) -> None:
    """Drop a DDP wrapper's references to the process group (its Reducer holds it in C++)."""
    for name in ("reducer", "logger", "process_group"):
        ddp.__dict__.pop(name, None)


def wrap(module: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """DistributedDataParallel around the backend's module (ORTModule first, then DDP)."""
    if not active():
        return module
    ids = [device.index] if device.type == "cuda" else None
    ddp = torch.nn.parallel.DistributedDataParallel(module, device_ids=ids)
    _wrappers.add(ddp)
    return ddp


def shard(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """This rank's contiguous slice of a global batch (every row-indexed array)."""
    n = world_size()
    if n == 1:
        return batch
    rows = len(batch["labels"])  # every task has labels; image rows have no input_ids
    if rows % n:
        raise ValueError(f"a global batch of {rows} rows does not split over {n} processes")
    per, r = rows // n, rank()
    return {
        k: (
            v[r * per : (r + 1) * per]
            if isinstance(v, np.ndarray) and v.ndim and len(v) == rows
            else v
        )
        for k, v in batch.items()
    }


def barrier() -> None:
    if active():
        torch.distributed.barrier()


def all_reduce_mean(value: torch.Tensor) -> torch.Tensor:
    """The mean of ``value`` over all ranks (a copy; the identity in one process)."""
    if not active():
        return value
    out = value.detach().clone()
    torch.distributed.all_reduce(out, op=torch.distributed.ReduceOp.SUM)
    return out / world_size()


def gather_rows(rows: np.ndarray) -> np.ndarray:
    """Every rank's ``rows``, rank 0's first (the identity in one process). Each rank gives as
    many rows of the same shape: ``shard`` splits a global batch evenly."""
    if not active():
        return rows
    on = "cuda" if torch.distributed.get_backend() == "nccl" else "cpu"
    mine = torch.from_numpy(np.ascontiguousarray(rows)).to(on)
    out = [torch.empty_like(mine) for _ in range(world_size())]
    torch.distributed.all_gather(out, mine)
    return torch.cat(out).cpu().numpy()


def any_rank(*flags: bool) -> tuple[bool, ...]:
    """Each flag true if it is true on any rank, so that every rank stops at the same step."""
    if not active():
        return flags
    on = "cuda" if torch.distributed.get_backend() == "nccl" else "cpu"  # nccl reduces on the GPU
    t = torch.tensor([float(f) for f in flags], device=on)
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
    return tuple(bool(v) for v in t.tolist())


def summary() -> dict[str, Any]:
    if world_size() == 1:
        return {"world_size": 1}
    backend = torch.distributed.get_backend() if active() else None
    return {"world_size": world_size(), "backend": backend}
