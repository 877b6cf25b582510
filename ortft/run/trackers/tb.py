"""TensorBoard event files in ``<run>/tensorboard/`` (scalars ``train/loss``, ``eval/<metric>``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ortft.run.trackers.base import Context, scalars


class TensorBoardSink:
    name, live = "tensorboard", True

    def __init__(self, ctx: Context) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.dir = ctx.run_dir / "tensorboard"
        # purge_step: on resume TensorBoard's reader drops the events a killed run logged after
        # the checkpoint (step >= checkpoint + 1), so no step shows twice
        step = ctx.resume_step
        self.writer: Any = SummaryWriter(
            str(self.dir), purge_step=None if step is None else step + 1
        )
        self.run_id: str | None = None  # the step is the checkpoint's own

    def log(self, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            for key, value in scalars(row).items():
                self.writer.add_scalar(key, value, row["step"])
        self.writer.flush()

    def close(self, status: str, artifacts: list[Path]) -> None:
        self.writer.close()

    def where(self) -> dict[str, Any]:
        return {"dir": str(self.dir)}
