"""The recipe's ``logging:`` section: the experiment trackers a run reports to, and the MLflow
tracking URI checked before any training (``ortft/run/tracking.py`` starts them)."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from ortft.recipe.fields import Section

TrackerName = Literal["tensorboard", "mlflow", "wandb"]
# MLflow's own store schemes (mlflow.tracking._tracking_service.utils); a bare word or a typo
# such as "htpp://" is caught here, before any training
_TRACKING_SCHEMES = (
    "file",
    "sqlite",
    "postgresql",
    "mysql",
    "mssql",
    "http",
    "https",
    "databricks",
)


def tracking_uri_problem(uri: str) -> str | None:
    """Why ``uri`` is no MLflow tracking URI (None: it is one)."""
    scheme, sep, rest = uri.partition(":")
    if not sep or scheme.split("+")[0] not in _TRACKING_SCHEMES:
        return (
            f"{uri!r} is not a tracking URI: use file:/path/mlruns, sqlite:///path.db, "
            "http(s)://host:port or databricks"
        )
    if scheme in ("http", "https") and not re.match(r"//[^/:]+", rest):
        return f"{uri!r} names no host"
    return None


class LoggingSection(Section):
    trackers: list[TrackerName] = Field(
        default_factory=list,
        description="Experiment trackers that receive the run's params, metrics and artifacts "
        "(docs/tracking.md): tensorboard (<run>/tensorboard/), mlflow, wandb; none by default.",
    )
    experiment: str | None = Field(
        None,
        description="MLflow experiment / W&B project (default: MLFLOW_EXPERIMENT_NAME or "
        "WANDB_PROJECT, else 'ortft').",
    )
    run_name: str | None = Field(
        None, description="The tracker run's name (default: the run directory's name)."
    )
    tags: dict[str, str] = Field(
        default_factory=dict, description="Extra tags on the tracker run (MLflow tags, W&B tags)."
    )
    tracking_uri: str | None = Field(
        None,
        description="MLflow tracking URI: file:/path, sqlite:///x.db, http(s)://host:port "
        "(default: MLFLOW_TRACKING_URI, else file:<run>/mlruns). W&B uses WANDB_* variables.",
    )
    tensorboard: bool = Field(
        False, description="Deprecated: same as trackers: [tensorboard] (a note on stderr)."
    )
    plot: bool = Field(
        False, description="Write <run>/curves.png, loss and eval curves (needs matplotlib)."
    )

    @field_validator("tracking_uri")
    @classmethod
    def _uri(cls, value: str | None) -> str | None:
        problem = value and tracking_uri_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _tensorboard_flag(self) -> LoggingSection:
        if self.tensorboard and "tensorboard" not in self.trackers:
            import logging

            logging.getLogger("ortft").warning(
                "logging.tensorboard is deprecated: write logging.trackers: [tensorboard]"
            )
            self.trackers = [*self.trackers, "tensorboard"]
        return self
