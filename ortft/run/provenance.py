"""Where a run came from: package versions, the git commit and whether it was dirty, the
recipe's hash and the start time (``summary.provenance``). Stdlib only."""

from __future__ import annotations

import platform
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from ortft.core import devenv

PACKAGES = [
    "ortft",
    "torch",
    "onnxruntime-training",
    "onnxruntime-training-cpu",  # its CPU build, what Python 3.12 has (requirements/lock-py312.txt)
    "torch-ort",
    "onnx",
    "transformers",
    "tokenizers",
    "datasets",
    "numpy",
]


def package_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def git_commit(path: Path) -> str | None:
    try:
        res = subprocess.run(
            ["git", "-C", str(path), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return res.stdout.strip() if res.returncode == 0 else None


def git_dirty(path: Path) -> bool | None:
    """Whether tracked files in ``path``'s repository differ from HEAD; None outside a repo.

    Untracked files do not count: run folders and data often sit untracked next to a recipe."""
    try:
        res = subprocess.run(
            ["git", "-C", str(path), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return bool(res.stdout.strip()) if res.returncode == 0 else None


def collect(recipe_path: Path | None, recipe_sha256: str) -> dict[str, Any]:
    where = recipe_path.resolve().parent if recipe_path else Path.cwd()
    return {
        "ortft": package_versions().get("ortft"),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "packages": package_versions(),
        "recipe_sha256": recipe_sha256,
        "git_commit": git_commit(where),
        "git_dirty": git_dirty(where),
        "started_at": utc_now(),
        "developer_overrides": devenv.set_overrides(),
    }


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
