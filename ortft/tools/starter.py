"""Shipped recipes (``ortft recipes``) and the commented starter recipe (``ortft init``)."""

from __future__ import annotations

from pathlib import Path

from ortft import tasks
from ortft.core.errors import UsageError
from ortft.env import ort_training
from ortft.tasks import traits


def recipes_dir() -> Path:
    """The top-level recipes/ of a source checkout, else the copy installed with the package."""
    package = Path(__file__).resolve().parents[1]  # ortft/
    for candidate in (package.parent / "recipes", package / "recipes"):
        if candidate.is_dir():
            return candidate
    raise UsageError("no shipped recipes found (is ortft installed completely?)")


def shipped_recipes() -> list[tuple[Path, str]]:
    """(path, one-line description) for every shipped recipe, sorted."""
    base = recipes_dir()
    out = []
    for path in sorted(base.rglob("*.yaml")):
        summary = ""
        for line in path.read_text().splitlines():
            text = line.lstrip("# ").strip()
            if (
                line.startswith("#")
                and text
                and not text.startswith(("Run:", "Override", "ortft ", "yaml-language-server:"))
            ):
                summary = text
                break
        out.append((path, summary))
    return out


def starters() -> dict[str, str]:
    """task name -> its family's starter recipe (``traits.Starts``), for the tasks that have one."""
    found = {name: traits.starter(tasks.get(name)) for name in tasks.names()}
    return {name: text for name, text in found.items() if text is not None}


def recipe_text(task: str, name: str = "recipe.yaml") -> str:
    """The starter recipe of ``task``, for a file called ``name``, on the route this install
    trains on (ORTModule where ONNX Runtime's training build is installed, else ``auto``)."""
    texts = starters()
    if task not in texts:
        raise UsageError(f"--task must be one of: {', '.join(texts)} (got '{task}')")
    backend = "ort" if ort_training.installed() is not None else "auto"
    return texts[task].format(name=name, backend=backend)
