"""Input paths as a recipe writes them: ``pkg://<package>/<path>`` (a file inside an installed
Python package), a path relative to the recipe's folder, or a Hub name.

Pure path logic, shared by data (where rows are read from) and the recipe (``check_paths``,
``dump``); ``ortft.recipe.io`` re-exports these names.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from ortft.core.errors import RecipeError

PKG_PREFIX = "pkg://"


def resolve_input_path(value: str, base_dir: Path) -> Path:
    if value.startswith(PKG_PREFIX):
        package, _, rest = value[len(PKG_PREFIX) :].partition("/")
        # find_spec on a top-level name locates the package without running its __init__.
        spec = importlib.util.find_spec(package) if package.isidentifier() else None
        if spec is None or not spec.submodule_search_locations:
            raise RecipeError(
                f"{value}: Python package '{package}' is not installed (run `make setup`)"
            )
        return Path(list(spec.submodule_search_locations)[0]) / rest
    path = Path(value).expanduser()
    return path if path.is_absolute() else (base_dir / path)


def looks_local(value: str) -> bool:
    """Whether a name_or_path/data value is meant as a file rather than a Hub id."""
    return (
        value.startswith((PKG_PREFIX, "/", "./", "../", "~"))
        or value.count("/") > 1
        or Path(value).suffix.lower()
        in {".csv", ".json", ".jsonl", ".parquet", ".txt", ".bz2", ".gz"}
    )
