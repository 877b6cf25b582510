"""Reading recipes: YAML (with line numbers) + dotted overrides -> a validated ``Recipe``.

Every problem is collected and reported at once, each with its dotted path, the YAML line it
comes from and, for an unknown key, the closest valid key.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from ortft.core.errors import RecipeError, UsageError, first_line
from ortft.data.paths import (  # noqa: F401 - re-exported: other modules import them from here
    PKG_PREFIX,
    looks_local,
    resolve_input_path,
)
from ortft.recipe.schema import Recipe


@dataclass(frozen=True)
class LoadedRecipe:
    recipe: Recipe
    path: Path | None  # the YAML file, when there is one
    base_dir: Path  # relative input paths resolve against this
    raw: dict[str, Any]  # after overrides, before validation (what checkpoints store)
    overrides: tuple[str, ...] = ()  # as given on the command line (for the resume command)

    @property
    def sha256(self) -> str:
        text = yaml.safe_dump(self.recipe.model_dump(mode="json"), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()

    def resolve_path(self, value: str) -> Path:
        """A recipe path as a real path: pkg:// in an installed package, else relative to the recipe."""
        return resolve_input_path(value, self.base_dir)


# --------------------------------------------------------------------------- YAML with lines


VALIDATOR_STEP = re.compile(r"function-(after|before|wrap|plain)\[")


def _line_map(node: yaml.Node, prefix: tuple[str, ...] = (), out: dict | None = None) -> dict:
    """Map every dotted key path in a composed YAML document to its 1-based line."""
    out = {} if out is None else out
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key_node, value_node in node.value:
            path = (*prefix, str(key_node.value))
            if key_node.value in seen:  # YAML would silently keep the last one
                raise yaml.MarkedYAMLError(
                    problem=f"duplicate key '{'.'.join(path)}'", problem_mark=key_node.start_mark
                )
            seen.add(key_node.value)
            out[path] = key_node.start_mark.line + 1
            _line_map(value_node, path, out)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            path = (*prefix, str(i))
            out[path] = item.start_mark.line + 1
            _line_map(item, path, out)
    return out


def read_yaml(path: Path) -> tuple[dict[str, Any], dict]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"{path}: recipe file not found") from None
    except (OSError, UnicodeDecodeError) as err:
        raise UsageError(f"{path}: cannot read recipe ({err})") from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
        lines = _line_map(node) if node is not None else {}
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise RecipeError(f"{where}malformed YAML: {err.problem}", source=str(path)) from None
    except yaml.YAMLError as err:  # ReaderError: a control character, found by property tests
        first = first_line(err)
        at = f" at character {err.position + 1}" if isinstance(err, yaml.reader.ReaderError) else ""
        raise RecipeError(f"malformed YAML{at}: {first}", source=str(path)) from None
    if data is None:
        raise RecipeError("the recipe is empty", source=str(path))
    if not isinstance(data, dict):
        raise RecipeError("a recipe must be a mapping of sections", source=str(path))
    return data, lines


# --------------------------------------------------------------------------- overrides


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Merge `a.b.c=value` strings into the raw mapping (values parsed as YAML scalars)."""
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key or any(not part for part in key.split(".")):
            raise UsageError(f"override '{item}' must look like section.key=value")
        try:
            parsed = yaml.safe_load(value) if value != "" else None
        except yaml.YAMLError:
            parsed = value
        set_value(data, key, parsed)
    return data


def set_value(data: dict[str, Any], key: str, value: Any) -> None:
    """Set the dotted ``key`` of the raw mapping to ``value`` (already typed), creating the
    sections on the way; a section given as a bare string (``model: bert``) becomes
    ``{name: bert}`` first."""
    *parents, last = key.split(".")
    node = data
    for part in parents:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {} if child is None or not isinstance(child, str) else {"name": child}
            node[part] = child
        node = child
    node[last] = value


# --------------------------------------------------------------------------- validation


def _fields_at(loc: tuple, data: Any = None) -> list[str]:
    """Valid field names of the section a pydantic error location points into (``data``: the
    raw mapping, which names the task whose options ``task.*`` are)."""
    from ortft import tasks

    model: Any = Recipe
    for part in loc[:-1]:
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return []
        field = model.model_fields.get(str(part))
        data = data.get(str(part)) if isinstance(data, dict) else None
        if field is None:
            return []
        ann = field.annotation
        if ann is tasks.TaskOptions:  # the union of the tasks' options: the one `name` picks
            name = data.get("name") if isinstance(data, dict) else None
            ann = tasks.options_model(name) if name in tasks.names() else ann
        # unwrap Optional[Section]
        args = getattr(ann, "__args__", None)
        if args:
            ann = next((a for a in args if isinstance(a, type) and issubclass(a, BaseModel)), ann)
        model = ann
    if isinstance(model, type) and issubclass(model, BaseModel):
        return list(model.model_fields)
    return []


def format_errors(
    err: ValidationError,
    lines: dict,
    overridden: frozenset[tuple[str, ...]] = frozenset(),
    data: Any = None,
) -> list[str]:
    problems = []
    for e in err.errors():
        # pydantic's validator steps (function-after[...]), not a user's key named so
        loc = tuple(str(p) for p in e["loc"] if not VALIDATOR_STEP.match(str(p)))
        # pydantic adds the union member / model name to some locations; drop non-field parts
        loc = tuple(p for p in loc if p not in {"str", "dict[str,any]", "TrainTokenizer"})
        dotted = ".".join(loc)
        # an override's own key, or a section it created that the YAML does not have
        if any(
            loc[: len(o)] == o or (o[: len(loc)] == loc and loc not in lines) for o in overridden
        ):
            where = " (command-line override)"
        else:
            line = None
            for n in range(len(loc), 0, -1):
                line = lines.get(loc[:n])
                if line:
                    break
            where = f" (line {line})" if line else ""
        head = f"{dotted}{where}: " if dotted else ""
        if e["type"] == "extra_forbidden":
            valid = _fields_at(loc, data)
            close = difflib.get_close_matches(loc[-1], valid, n=1, cutoff=0.5)
            hint = (
                f"; did you mean '{close[0]}'?"
                if close
                else (f"; valid keys: {', '.join(valid)}" if valid else "")
            )
            problems.append(f"{head}unknown key{hint}")
        else:
            msg = e["msg"].removeprefix("Value error, ")
            # a model validator reports every cross-field rule it breaks, one a line (rules.py)
            problems += [f"{head}{line}" for line in msg.splitlines() or [msg]]
    return problems


def check_paths(loaded: LoadedRecipe) -> list[str]:
    """Input paths that are clearly local must exist (found at validation, not mid-run)."""
    r = loaded.recipe
    candidates = {
        "model.name_or_path": r.model.name_or_path,
        "model.tokenizer.path": r.model.tokenizer.path,
        "data.train": r.data.train if r.data.format != "hub" else None,
        "data.eval": r.data.eval if r.data.format != "hub" else None,
    }
    if isinstance(r.deepspeed, str):
        candidates["deepspeed"] = r.deepspeed
    problems = []
    for field, value in candidates.items():
        if not value:
            continue
        try:
            path = loaded.resolve_path(value)
        except RecipeError as err:
            problems.append(f"{field}: {err.problems[0]}")
            continue
        if looks_local(value) and not path.exists():  # anything else may be a Hub id
            problems.append(f"{field}: {path} does not exist")
    problems += _position_problems(loaded)
    if isinstance(r.deepspeed, str) and loaded.resolve_path(r.deepspeed).is_file():
        from ortft.recipe import deepspeed as zero  # a JSON file: the inline mapping's checks

        try:
            problems += [
                f"deepspeed: {p}" for p in zero.check(zero.read(r.deepspeed, loaded.base_dir), r)
            ]
        except ValueError as err:
            problems.append(f"deepspeed: {err}")
    return problems


def _position_problems(loaded: LoadedRecipe) -> list[str]:
    """data.max_length fits a local model folder's learned position table (its config.json,
    read without transformers; rules.LEARNED_POSITIONS says which models have one)."""
    from ortft import tasks
    from ortft.recipe.rules import position_limit, reads_text

    value = loaded.recipe.model.name_or_path
    if not value or not reads_text(tasks.get(loaded.recipe.task.name, loaded.recipe.task)):
        return []  # data.max_length cuts texts only: a folder of another kind is named later
    try:
        config_file = loaded.resolve_path(value) / "config.json"
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecipeError):
        return []  # no local config.json: the model loader names what is wrong
    if not isinstance(config, dict):
        return []
    limit = position_limit(str(config.get("model_type", "")), config)
    n = loaded.recipe.data.max_length
    if limit is None or n <= limit[0]:
        return []
    return [
        f"data.max_length: {n} is beyond the {limit[0]} positions of {config_file} "
        f"({config.get('model_type')} learns one embedding per position, {limit[1]}="
        f"{config[limit[1]]}); lower data.max_length to {limit[0]} or less"
    ]


def load(
    path: str | Path | None,
    overrides: list[str] | None = None,
    data: dict[str, Any] | None = None,
    check_files: bool = True,
) -> LoadedRecipe:
    """Read, override and validate a recipe; raises RecipeError with every problem at once."""
    lines: dict = {}
    if path is not None:
        path = Path(path)
        data, lines = read_yaml(path)
    data = apply_overrides(dict(data or {}), overrides or [])
    source = str(path) if path else "recipe"
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as err:
        overridden = frozenset(tuple(o.partition("=")[0].split(".")) for o in overrides or [])
        raise RecipeError(format_errors(err, lines, overridden, data), source=source) from None
    base_dir = path.resolve().parent if path else Path.cwd()
    loaded = LoadedRecipe(
        recipe=recipe, path=path, base_dir=base_dir, raw=data, overrides=tuple(overrides or [])
    )
    if check_files:
        problems = check_paths(loaded)
        if problems:
            raise RecipeError(problems, source=source)
    return loaded


def dump(recipe: Recipe, base_dir: Path | None = None) -> str:
    """The resolved recipe as YAML; with ``base_dir``, local input paths become absolute so
    the copy saved in a run folder validates and re-runs from anywhere."""
    data = recipe.model_dump(mode="json")
    if base_dir is not None:

        def absolute(value: str | None) -> str | None:
            if not value or value.startswith(PKG_PREFIX):
                return value
            path = resolve_input_path(value, base_dir)
            return str(path.resolve()) if path.exists() or looks_local(value) else value

        data["model"]["name_or_path"] = absolute(data["model"]["name_or_path"])
        data["model"]["tokenizer"]["path"] = absolute(data["model"]["tokenizer"]["path"])
        if data["data"]["format"] != "hub":
            data["data"]["train"] = absolute(data["data"]["train"])
            data["data"]["eval"] = absolute(data["data"]["eval"])
        if isinstance(data.get("deepspeed"), str):
            data["deepspeed"] = absolute(data["deepspeed"])
    return yaml.safe_dump(data, sort_keys=False)
