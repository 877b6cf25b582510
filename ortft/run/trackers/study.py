"""``ortft hpo``'s trackers: a study is a parent, each trial a child run.

MLflow: one parent run per study (found again when the study continues), each trial's run
tagged ``mlflow.parentRunId``, all in one store (``<study>/mlruns`` unless a URI is given).
W&B: the trials share a group named after the study. TensorBoard: each trial writes
``<study>/trial-NNN/tensorboard/``, so ``tensorboard --logdir <study>`` shows them side by side.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from ortft.recipe.schema import LoggingSection
from ortft.run.trackers.base import check

log = logging.getLogger("ortft")


class Study:
    """``parent`` goes to each trial's ``lifecycle.run``, ``overrides`` onto its recipe."""

    def __init__(self, spec: LoggingSection, base: Path, name: str) -> None:
        check(spec, base)  # not installed, a bad URI: exit 2 before the first trial
        self.parent: dict[str, str] = {}
        self.overrides: list[str] = []
        self.client: Any = None
        if "wandb" in spec.trackers:
            self.parent["wandb_group"] = name
        if "mlflow" not in spec.trackers:
            return
        from ortft.run.trackers.mlflow_sink import open_experiment

        uri = spec.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        if uri is None:  # one store for the whole study, not one per trial directory
            uri = f"file:{(base / 'mlruns').resolve()}"
            self.overrides.append(f"logging.tracking_uri={uri}")
        try:
            self.client, _, exp_id = open_experiment(uri, spec.experiment)
            found = self.client.search_runs(
                [exp_id], f"tags.`ortft.study` = '{name}'", max_results=1
            )
            run = (
                found[0]
                if found
                else self.client.create_run(
                    exp_id, run_name=name, tags={"ortft.study": name, "mlflow.runName": name}
                )
            )
            self.parent["mlflow"] = run.info.run_id
        except Exception as err:  # noqa: BLE001 - trials still run, as runs of their own
            log.warning("tracker mlflow: no parent run for study %s: %s", name, err)
            self.client = None

    def close(self) -> None:
        if self.client is not None:
            self.client.set_terminated(self.parent["mlflow"], "FINISHED")
