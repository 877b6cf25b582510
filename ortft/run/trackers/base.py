"""What every tracker sink shares: its context, the sink protocol, row and recipe shapes."""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ortft.core.errors import InputError
from ortft.recipe.tracking import LoggingSection, tracking_uri_problem

# tracker -> the module it imports, the package that brings it (pinned in requirements/lock.txt)
PACKAGES = {
    "tensorboard": ("tensorboard", "tensorboard"),
    "mlflow": ("mlflow", "mlflow-skinny"),
    "wandb": ("wandb", "wandb"),
}
# MLflow's database stores need SQLAlchemy, which mlflow-skinny leaves out
_DB_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")


@dataclass
class Context:
    """What a sink needs to open (or reopen, on resume) its run."""

    run_dir: Path
    spec: LoggingSection
    params: dict[str, str]  # the resolved recipe, flattened to dotted keys
    tags: dict[str, str]  # provenance + logging.tags
    resume_id: str | None = None  # the run id a resumed run continues (from the checkpoint)
    resume_step: int | None = None  # the checkpoint's step a resumed run continues after
    parent: dict[str, str] = field(default_factory=dict)  # ortft hpo: the study's run

    @property
    def name(self) -> str:
        return self.spec.run_name or self.run_dir.name


class Sink(Protocol):
    name: str
    run_id: str | None  # stored in the checkpoint: a resume continues this run
    live: bool  # True: gets every row at once (TensorBoard purges what a resume redoes)

    def log(self, rows: list[dict[str, Any]]) -> None: ...

    def close(self, status: str, artifacts: list[Path]) -> None: ...

    def where(self) -> dict[str, Any]: ...


def tracking_uri(spec: LoggingSection, run_dir: Path) -> str:
    """logging.tracking_uri, else MLFLOW_TRACKING_URI, else a file store in the run dir."""
    return (
        spec.tracking_uri
        or os.environ.get("MLFLOW_TRACKING_URI")
        or f"file:{(run_dir / 'mlruns').resolve()}"
    )


def check(spec: LoggingSection, run_dir: Path) -> None:
    """Every named tracker is installed and MLflow's URI is one: an input error if not."""
    for name in spec.trackers:
        module, package = PACKAGES[name]
        if importlib.util.find_spec(module) is None:
            raise InputError(
                f"logging.trackers: {name} needs the '{package}' package: "
                f"pip install -r requirements/lock.txt (it pins {package})"
            )
    if "mlflow" not in spec.trackers:
        return
    uri = tracking_uri(spec, run_dir)
    field_name = "logging.tracking_uri" if spec.tracking_uri else "MLFLOW_TRACKING_URI"
    problem = tracking_uri_problem(uri)
    db = uri.split(":")[0].split("+")[0] in _DB_SCHEMES
    if problem is None and db and importlib.util.find_spec("sqlalchemy") is None:
        problem = (
            f"{redact_uri(uri)!r} needs SQLAlchemy, which mlflow-skinny leaves out: use a file: store "
            "or a server (http://host:port), or pip install sqlalchemy alembic"
        )
    if problem:
        raise InputError(f"{field_name}: {problem}")


def redact_uri(uri: str) -> str:
    """``https://user:token@host/x`` -> ``https://***@host/x``: a tracking URI may carry a
    credential, and the URI itself is logged (summary.json, the recipe's params)."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(uri)
    if "@" not in parts.netloc:
        return uri
    return urlunsplit(parts._replace(netloc="***@" + parts.netloc.rsplit("@", 1)[1]))


def flatten(tree: Any, prefix: str = "") -> dict[str, str]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": "1"}``; lists as JSON (MLflow params are strings);
    ``logging.tracking_uri`` without its credential (:func:`redact_uri`)."""
    if prefix == "logging.tracking_uri" and isinstance(tree, str):
        return {prefix: redact_uri(tree)}
    if not isinstance(tree, dict):
        return {prefix: tree if isinstance(tree, str) else json.dumps(tree)}
    out: dict[str, str] = {}
    for key, value in tree.items():
        out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def scalars(row: dict[str, Any]) -> dict[str, float]:
    """A metrics row's numbers as ``<kind>/<key>`` (``train/loss``, ``eval/accuracy``)."""
    kind = row["kind"]
    return {
        f"{kind}/{k}": float(v)
        for k, v in row.items()
        if k not in ("kind", "step", "epoch", "time_s")
        and isinstance(v, (int, float))
        and not isinstance(v, bool)
    }
