"""Weights & Biases through ``wandb.init`` (online, or offline with WANDB_MODE=offline: the run
folder lands in ``<run>/wandb/`` unless WANDB_DIR says otherwise; ``wandb sync`` uploads it).

The W&B run id is stored with the checkpoint and a resume reopens it (``resume="allow"``).
WANDB_* variables are W&B's own (WANDB_MODE, WANDB_PROJECT, WANDB_ENTITY, WANDB_API_KEY, ...).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ortft.run.trackers.base import Context, scalars

_EXIT = {"completed": 0, "stopped": 0}


class WandbSink:
    name, live = "wandb", False

    def __init__(self, ctx: Context) -> None:
        import wandb
        from wandb.sdk.lib.runid import generate_id

        group = ctx.parent.get("wandb_group")
        self.run: Any = wandb.init(
            project=ctx.spec.experiment or os.environ.get("WANDB_PROJECT") or "ortft",
            name=ctx.name,
            id=ctx.resume_id or generate_id(),
            resume="allow",
            dir=os.environ.get("WANDB_DIR") or str(ctx.run_dir),
            group=group,
            job_type="trial" if group else None,
            tags=[f"{k}:{v}" for k, v in ctx.spec.tags.items()],
            # nested like the recipe file, provenance beside it
            config={"recipe": _unflatten(ctx.params), "provenance": ctx.tags},
            reinit="create_new",  # ortft hpo: one run per trial in one process
            # console capture would copy ortft's stderr, and the code a user's private script
            # W&B writes its .wandb file every 15 s by default: a kill -9 lost all of a 10 s run;
            # 1 s bounds what a kill can take (rows come at checkpoints, not every step)
            settings=wandb.Settings(
                console="off", save_code=False, x_transaction_log_flush_interval=1.0
            ),
        )
        self.run_id: str | None = self.run.id

    def log(self, rows: list[dict[str, Any]]) -> None:
        by_step: dict[int, dict[str, float]] = {}
        for row in rows:  # a step's train and eval rows as one history row
            by_step.setdefault(row["step"], {}).update(scalars(row))
        for step, values in by_step.items():  # commit: not held back until a later step
            self.run.log(values, step=step, commit=True)

    def close(self, status: str, artifacts: list[Path]) -> None:
        for path in artifacts:
            self.run.save(str(path), base_path=str(path.parent), policy="now")
        self.run.finish(exit_code=_EXIT.get(status, 1))

    def where(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "dir": str(self.run.dir), "project": self.run.project}


def _unflatten(flat: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in flat.items():
        *parents, leaf = key.split(".")
        node = out
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out
