"""MLflow through ``MlflowClient`` (no global active run, so ``ortft hpo`` trials nest cleanly).

params = the resolved recipe (flattened), metrics per step, tags = provenance + logging.tags,
artifacts = summary.json, the model card and the export's export.json. MLFLOW_* variables are
MLflow's own (MLFLOW_TRACKING_URI, MLFLOW_EXPERIMENT_NAME, MLFLOW_TRACKING_TOKEN, ...).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from ortft.run.trackers.base import Context, redact_uri, scalars, tracking_uri

# MLflow's batch limits (mlflow/utils/validation.py): 100 params, 1000 metrics per log_batch
_PARAMS_PER_BATCH, _METRICS_PER_BATCH = 100, 1000
_STATUS = {
    "completed": "FINISHED",
    "stopped": "FINISHED",
    "interrupted": "KILLED",
    "pruned": "KILLED",
}


def open_experiment(uri: str, experiment: str | None) -> tuple[Any, str, str]:
    """A client on ``uri``, the experiment's name and id (created if new)."""
    if uri.startswith("file:"):
        # MLflow 3 refuses a file store unless asked: it is the one store mlflow-skinny
        # serves without SQLAlchemy, and a run dir's mlruns/ needs no server
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    client: Any = MlflowClient(tracking_uri=uri)
    name = experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or "ortft"
    found = client.get_experiment_by_name(name)
    return client, name, found.experiment_id if found else client.create_experiment(name)


class MlflowSink:
    name, live = "mlflow", False

    def __init__(self, ctx: Context) -> None:
        from mlflow.entities import Param

        self.uri = tracking_uri(ctx.spec, ctx.run_dir)
        self.client, self.experiment, exp_id = open_experiment(self.uri, ctx.spec.experiment)
        if ctx.resume_id:  # params are immutable in MLflow: the first start logged them
            self.run_id: str | None = ctx.resume_id
            self.client.update_run(ctx.resume_id, status="RUNNING")
            return
        tags = {**ctx.tags, "mlflow.runName": ctx.name}
        if ctx.parent.get("mlflow"):
            tags["mlflow.parentRunId"] = ctx.parent["mlflow"]
        run = self.client.create_run(exp_id, run_name=ctx.name, tags=tags)
        self.run_id = run.info.run_id
        params = [Param(k, v) for k, v in ctx.params.items()]
        for i in range(0, len(params), _PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=params[i : i + _PARAMS_PER_BATCH])

    def log(self, rows: list[dict[str, Any]]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [
            Metric(key, value, now, row["step"])
            for row in rows
            for key, value in scalars(row).items()
        ]
        for i in range(0, len(metrics), _METRICS_PER_BATCH):
            self.client.log_batch(self.run_id, metrics=metrics[i : i + _METRICS_PER_BATCH])

    def close(self, status: str, artifacts: list[Path]) -> None:
        for path in artifacts:
            self.client.log_artifact(self.run_id, str(path))
        self.client.set_terminated(self.run_id, _STATUS.get(status, "FAILED"))

    def where(self) -> dict[str, Any]:
        uri = redact_uri(self.uri)  # summary.json: never a credential the URI carries
        return {"run_id": self.run_id, "tracking_uri": uri, "experiment": self.experiment}
