"""Read back what the trackers wrote, each with its own library's reader.

TensorBoard: ``EventAccumulator`` (tensorboard's event reader). MLflow: ``MlflowClient``.
W&B offline: the run folder's ``run-<id>.wandb`` transaction log, read as W&B writes it (LevelDB
log framing, records of ``wandb.proto.wandb_internal_pb2.Record``) — the file ``wandb sync``
uploads; wandb 0.31 ships no reader of its own for it.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

# environment for a tracker test: W&B offline and quiet, nothing leaves the machine
OFFLINE = {
    "WANDB_MODE": "offline",
    "WANDB_SILENT": "true",
    "WANDB_DISABLE_GIT": "true",
    "WANDB_X_DISABLE_STATS": "true",  # no system-metrics sampler: a faster start and finish
    "MLFLOW_ALLOW_FILE_STORE": "true",
}


def tensorboard_steps(run_dir: Path, tag: str = "train/loss") -> list[int]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    return [e.step for e in acc.Scalars(tag)]


def mlflow_client(run_dir: Path) -> Any:
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=f"file:{(run_dir / 'mlruns').resolve()}")


def wandb_records(path: Path) -> list[Any]:
    """Every record of one ``.wandb`` file: a 7-byte header (':W&B', magic, version), then
    32 KiB blocks of chunks (crc32 4, length 2, type 1: full, first, middle, last)."""
    from wandb.proto import wandb_internal_pb2

    data, block, out, pos, part = path.read_bytes(), 32768, [], 7, b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a chunk header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if length == 0 and kind == 0:  # zeroed rest of a block
            pos += left
            continue
        part += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # full or last: one whole record
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(part)
            out.append(rec)
            part = b""
    return out


def wandb_history(run_dir: Path) -> tuple[set[str], dict[int, dict[str, Any]], list[int]]:
    """Across every offline folder of the run (a resume writes a new one): the run ids, the
    history by step, and every step in the order logged (a step twice shows here twice)."""
    ids, by_step, steps = set(), {}, []
    for path in sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb")):
        for rec in wandb_records(path):
            kind = rec.WhichOneof("record_type")
            if kind == "run":
                ids.add(rec.run.run_id)
            if kind == "history":
                row = {
                    i.key or "/".join(i.nested_key): json.loads(i.value_json)
                    for i in rec.history.item
                }
                step = int(row["_step"])
                if any(k.startswith(("train/", "eval/")) for k in row):
                    steps.append(step)
                    by_step.setdefault(step, {}).update(row)
    return ids, by_step, steps
