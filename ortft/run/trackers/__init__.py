"""Experiment trackers behind one small interface: TensorBoard, MLflow, Weights & Biases.

Each sink is built by ``open_sink(name, ctx)`` (its library imported only then), receives metric
rows through ``log(rows)`` and ends with ``close(status, artifacts)``. ``check`` runs before
training: a tracker named but not installed, or a malformed tracking URI, is an input error
(exit 2). ``ortft.run.tracking.Tracker`` drives the sinks and turns a later failure into a warning.
"""

from __future__ import annotations

from ortft.run.trackers.base import (  # noqa: F401 - the package's interface
    PACKAGES,
    Context,
    Sink,
    check,
    flatten,
    scalars,
    tracking_uri,
)


def open_sink(name: str, ctx: Context) -> Sink:
    if name == "tensorboard":
        from ortft.run.trackers.tb import TensorBoardSink

        return TensorBoardSink(ctx)
    if name == "mlflow":
        from ortft.run.trackers.mlflow_sink import MlflowSink

        return MlflowSink(ctx)
    from ortft.run.trackers.wandb_sink import WandbSink

    return WandbSink(ctx)
