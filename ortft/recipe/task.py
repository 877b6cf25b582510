"""The recipe's ``task:``: the union of every registered task's options, told apart by ``name``.

The union is resolved at validation time from the task registry (``ortft.tasks``), so a task
registered later (a test's toy task, a plugin) is accepted without touching the schema.
``task: causal-lm`` is shorthand for ``{name: causal-lm}``. Setting an option of another task is
an error naming the task it belongs to; another task's option at its default value is dropped
(a recipe dumped by older ortft spelled out every task's options).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import PlainValidator, SerializeAsAny, ValidationError

from ortft import tasks
from ortft.tasks import TaskOptions


def _field_error(loc: str, kind: str, value: Any, **ctx: Any) -> ValidationError:
    line: dict[str, Any] = {"type": kind, "loc": (loc,), "input": value}
    if ctx:
        line["ctx"] = ctx
    return ValidationError.from_exception_data("task", [line])  # type: ignore[list-item]


def _quoted(names: list[str]) -> str:
    """'a', 'b' or 'c' (pydantic's wording for a Literal's choices)."""
    q = [repr(n) for n in names]
    return q[0] if len(q) == 1 else f"{', '.join(q[:-1])} or {q[-1]}"


def validate_task(value: Any) -> TaskOptions:
    """A task name or mapping -> the options model of the task it names."""
    if isinstance(value, TaskOptions):
        return value
    if isinstance(value, str):
        value = {"name": value}
    if not isinstance(value, dict):
        raise ValueError("give a task name or a mapping with name: and the task's options")
    name = value.get("name")
    if "name" not in value:
        raise _field_error("name", "missing", value)
    if name not in tasks.names():
        raise _field_error("name", "literal_error", name, expected=_quoted(tasks.names()))
    model = tasks.options_model(name)
    kept, foreign = {}, []
    for key, v in value.items():
        owner = None if key in model.model_fields else tasks.owner_of(key, besides=name)
        if owner is None:  # its own option, or no task's: extra="forbid" reports that one
            kept[key] = v
        elif v != tasks.options_model(owner).model_fields[key].default:
            foreign.append(f"task.{key} is an option of {owner}")
    options = model.model_validate(kept)  # its own errors (unknown keys, bad values) first
    if foreign:
        raise ValueError(", ".join(foreign) + f", not of {name}")
    return options


# The recipe's `task:` field type; dumps every field of the task's own options model.
TaskField = Annotated[SerializeAsAny[TaskOptions], PlainValidator(validate_task)]


def all_options() -> set[str]:
    """Every option name of every registered task (dotted keys under task. that can exist)."""
    return {f for n in tasks.names() for f in tasks.options_model(n).model_fields}


def read_task(recipe_yaml: Path) -> TaskOptions | None:
    """The task options a saved recipe (a run's final/recipe.yaml) names; None when there is no
    such file or its ``task:`` does not validate (only ``task:`` is read, not the whole recipe)."""
    import yaml

    try:
        raw = yaml.safe_load(recipe_yaml.read_text(encoding="utf-8"))
        return validate_task(raw["task"]) if isinstance(raw, dict) and "task" in raw else None
    except (OSError, yaml.YAMLError, ValueError):  # pydantic's ValidationError is a ValueError
        return None
