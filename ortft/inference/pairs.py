"""Sentence pairs in ``ortft predict`` and ``ortft eval``: which two text columns a pair model
reads, and each input's two texts.

A model is a pair model when the recipe it was trained with reads a text pair per row
(``data.text_pair_column``, through ``Task.pair_columns``; a run's ``final/recipe.yaml``) or
its export folder records one (export.json's ``text_pair``), so an export folder alone knows.
Its inputs give both texts, as ``text`` + ``text_pair`` or under the training's own column
names. An input with one text is an error naming the missing field, never a single-text
prediction; a ``text_pair`` given to a single-text model is an error too.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from ortft.core.errors import InputError
from ortft.data.spec import DataSection
from ortft.tasks.protocols import pairs_of

FIRST, SECOND = "text", "text_pair"  # the field names every pair model takes
Rows = TypeVar("Rows")


def columns(folder: Path, recipe_yaml: Path | None, task: Any) -> tuple[str, str] | None:
    """A pair model's (first, second) training text columns; None for a single-text model."""
    data = _saved_data(recipe_yaml) if recipe_yaml is not None else None
    if data is not None:
        return pairs_of(task, data)
    try:
        recorded = json.loads((folder / "export.json").read_text()).get("text_pair")
        return (str(recorded["text_column"]), str(recorded["text_pair_column"]))
    except (OSError, ValueError, AttributeError, KeyError, TypeError):  # none recorded
        return None


def _saved_data(recipe_yaml: Path) -> DataSection | None:
    """The ``data:`` section of a saved recipe (None: no file, or no such section). Not
    validated: only its column names are read, and an older ortft's recipe may hold a field
    this one no longer has."""
    import yaml

    try:
        raw = yaml.safe_load(recipe_yaml.read_text(encoding="utf-8"))
        return DataSection.model_construct(**raw["data"])
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        return None


def _also(pair: tuple[str, str]) -> str:
    """The training columns, when they are not text + text_pair themselves."""
    if pair == (FIRST, SECOND):
        return ""
    return f", or '{pair[0]}' and '{pair[1]}' (its training columns)"


def _string(obj: dict[str, Any], key: str, where: str) -> str:
    if not isinstance(obj.get(key), str):
        raise InputError(f"{where}: a JSON line needs a string field '{key}'")
    return obj[key]


def texts(
    inputs: list[tuple[str, dict[str, Any]]], pair: tuple[str, str] | None
) -> tuple[list[str], list[str] | None]:
    """``ortft predict``'s texts (``inputs``: (where, object) per line) and, for a pair model
    (``pair``: its training columns), the second texts; None for a single-text model."""
    if pair is None:
        for where, obj in inputs:
            if SECOND in obj:
                raise InputError(
                    f"{where}: '{SECOND}' given, but this model classifies single texts (no "
                    "recipe or export.json of it sets data.text_pair_column)"
                )
        return [_string(obj, FIRST, where) for where, obj in inputs], None
    first, second = [], []
    for where, obj in inputs:
        trained = pair[1] in obj or (pair[0] in obj and SECOND not in obj)
        a, b = pair if trained else (FIRST, SECOND)
        if b not in obj:
            raise InputError(
                f"{where}: missing '{b}': a sentence-pair model takes JSON lines with "
                f"'{FIRST}' and '{SECOND}'{_also(pair)}"
            )
        first.append(_string(obj, a, where))
        second.append(_string(obj, b, where))
    return first, second


def eval_rows(
    read: Callable[[DataSection], Rows], spec: DataSection, pair: tuple[str, str] | None
) -> tuple[Rows, DataSection]:
    """``ortft eval --data``'s rows (``read(spec)``) and the section that read them: a pair
    model's under its training columns, else under text + text_pair; when neither reads, the
    first error, with what a pair model reads."""
    if pair is None:
        return read(spec), spec
    trained = spec.model_copy(update={"text_column": pair[0], "text_pair_column": pair[1]})
    try:
        return read(trained), trained
    except InputError as err:
        error = err
    if pair != (FIRST, SECOND):
        plain = spec.model_copy(update={"text_column": FIRST, "text_pair_column": SECOND})
        try:
            return read(plain), plain
        except InputError:
            pass
    raise InputError(f"{error}; a sentence-pair model reads '{FIRST}' and '{SECOND}'{_also(pair)}")
