"""The recipe's JSON Schema (``ortft schema``) and the Markdown reference drawn from it
(``ortft schema --markdown``), both committed under docs/ and checked for staleness by
tests/test_schema.py.

The schema is pydantic's, with what pydantic cannot see filled in: ``task:`` (a validator
picks the options model by ``name``, so pydantic sees no type) becomes a ``oneOf`` of the
built-in tasks' options keyed on ``name``, or a bare task name; and the two shorthands that
``mode="before"`` validators accept (``precision: bf16``, ``training.max_time: 15m``). Only
``tasks.BUILTIN`` goes in, never a task registered at run time, so the file is the same in
every process. Editors read it through the first line of a recipe:
``# yaml-language-server: $schema=../docs/recipe.schema.json``.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from ortft import tasks
from ortft.recipe.schema import PrecisionSection, Recipe

SCHEMA_FILE = "docs/recipe.schema.json"
REFERENCE_FILE = "docs/recipe-reference.md"
DRAFT = "https://json-schema.org/draft/2020-12/schema"  # the draft pydantic 2 writes
DURATION = r"^\s*([0-9]*\.?[0-9]+)\s*([smh]?)\s*$"  # schema.TrainingSection._duration's


def _task_schemas(defs: dict[str, Any]) -> dict[str, Any]:
    """``task:``: a bare task name, or a mapping whose ``name`` picks that task's options
    schema (in ``defs`` as ``task.<name>``). An ``if name == X then task.X`` per task rather
    than a ``oneOf``: a validator then names the one wrong key, where a ``oneOf`` reports
    that no branch of nine matched."""
    names = list(tasks.BUILTIN)
    branches = []
    for name, module in tasks.BUILTIN.items():
        options = tasks.options_model(name)
        schema = options.model_json_schema(ref_template="#/$defs/{model}")
        defs.update(schema.pop("$defs", {}))
        schema["title"] = f"task: {name}"
        schema.setdefault("description", f"The options of task {name} ({module}).")
        defs[f"task.{name}"] = schema
        picked = {"type": "object", "properties": {"name": {"const": name}}, "required": ["name"]}
        branches.append({"if": picked, "then": {"$ref": f"#/$defs/task.{name}"}})
    mapping = {"type": "object", "properties": {"name": {"enum": names}}, "required": ["name"]}
    return {
        "title": "Task",
        "description": "What the model learns: a task name, or a mapping with name: and that "
        "task's options (each family's under ortft/families/).",
        "anyOf": [{"type": "string", "enum": names}, mapping],
        "allOf": branches,
    }


def recipe_schema() -> dict[str, Any]:
    """The recipe's JSON Schema (draft 2020-12), as committed in docs/recipe.schema.json."""
    schema = copy.deepcopy(Recipe.model_json_schema())
    defs = schema["$defs"]
    schema["properties"]["task"] = _task_schemas(defs)
    dtypes = PrecisionSection.model_json_schema()["properties"]["dtype"]["enum"]
    schema["properties"]["precision"] = {
        "anyOf": [{"$ref": "#/$defs/PrecisionSection"}, {"type": "string", "enum": dtypes}],
        "description": "Training precision: a mapping, or the dtype alone (precision: bf16).",
    }
    max_time = defs["TrainingSection"]["properties"]["max_time"]
    max_time["anyOf"].insert(1, {"type": "string", "pattern": DURATION})
    schema["$defs"] = dict(sorted(defs.items()))
    return {"$schema": DRAFT, **schema}


def schema_text() -> str:
    """docs/recipe.schema.json's text: the schema, indented, ending in a newline."""
    return json.dumps(recipe_schema(), indent=2, ensure_ascii=False) + "\n"


# --------------------------------------------------------------------------- Markdown


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref")
    return defs[ref.rsplit("/", 1)[-1]] if ref else node


def _section(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any] | None:
    """The object schema with properties a field holds (directly, or in an ``anyOf``)."""
    for option in [node, *node.get("anyOf", [])]:
        target = _resolve(option, defs)
        if target.get("properties"):
            return target
    return None


def _type(node: dict[str, Any], defs: dict[str, Any]) -> str:
    if "$ref" in node:
        return "section" if _resolve(node, defs).get("properties") else node["$ref"]
    if "const" in node:
        return f"`{node['const']}`"
    if "enum" in node:
        return " | ".join(f"`{v}`" for v in node["enum"])
    for key in ("anyOf", "oneOf"):
        if key in node:  # a union: each kind once (task: a name, or one of nine sections)
            return " or ".join(dict.fromkeys(_type(n, defs) for n in node[key]))
    kind = node.get("type", "any")
    if kind == "array":
        if "prefixItems" in node:
            return "[" + ", ".join(_type(n, defs) for n in node["prefixItems"]) + "]"
        return f"list of {_type(node.get('items', {}), defs)}"
    if kind == "object" and isinstance(node.get("additionalProperties"), dict):
        return "mapping"
    return str(kind)


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _table(prefix: str, section: dict[str, Any], defs: dict[str, Any]) -> list[str]:
    """The rows of one section, then its nested sections' tables (keys dotted from ``prefix``)."""
    lines = ["| key | type | default | description |", "|---|---|---|---|"]
    nested: list[tuple[str, dict[str, Any]]] = []
    required = set(section.get("required", []))
    for key, node in section["properties"].items():
        dotted = f"{prefix}.{key}" if prefix else key
        # task: its options are listed per task (reference() below)
        inner = None if dotted == "task" else _section(node, defs)
        if inner is not None:
            nested.append((dotted, inner))
        default = f"`{json.dumps(node['default'])}`" if "default" in node else "—"
        default = "required" if key in required else default
        shown = "section" if inner is not None else _type(node, defs)
        about = node.get("description") or (inner or {}).get("description", "")
        lines.append(f"| `{dotted}` | {_cell(shown)} | {_cell(default)} | {_cell(about)} |")
    for dotted, inner in nested:
        lines += ["", f"{'#' * min(2 + dotted.count('.'), 4)} `{dotted}`", ""]
        if inner.get("description"):
            lines += [inner["description"], ""]
        lines += _table(dotted, inner, defs)
    return lines


def reference() -> str:
    """docs/recipe-reference.md: every recipe key with its type, default and description."""
    schema = recipe_schema()
    defs = schema["$defs"]
    lines = [
        "# Recipe reference",
        "",
        "<!-- generated by `ortft schema --markdown -o docs/recipe-reference.md` from the field "
        "descriptions in ortft/; do not edit by hand -->",
        "",
        "Every key of a recipe, section by section. A recipe is strict: an unknown key is an "
        "error. Editors check and complete recipes against "
        "[recipe.schema.json](recipe.schema.json) (`ortft schema`).",
        "",
        "## Top level",
        "",
    ]
    lines += _table("", schema, defs)
    lines += ["", "## `task` options", "", schema["properties"]["task"]["description"], ""]
    for name in tasks.BUILTIN:
        lines += [f"### `task: {name}`", ""] + _table("task", defs[f"task.{name}"], defs) + [""]
    return "\n".join(lines).rstrip("\n") + "\n"
