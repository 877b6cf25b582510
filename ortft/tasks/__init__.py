"""Tasks: what a model learns. Each task is in a family package under ``ortft/families/``,
registered by one line in BUILTIN.

A family package (or a task module) defines ``Options`` (its options model, a ``TaskOptions`` with
``name: Literal["<task>"]``) and ``build(options) -> Task`` (a ``Task`` subclass: how raw rows
become fixed-length token arrays, which transformers auto class builds the model, how eval is
scored, what its ONNX export looks like). A family package of several tasks gives each one's
pair in its ``TASKS`` table (task name -> (Options, build)); BUILTIN names the package for each.
The recipe's ``task:`` accepts the options of every registered task; the training loop never
changes. Task modules import numpy at most at module level (never torch), and are imported only
when a task is looked up.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from ortft.tasks.base import Encoded, ExportKind, Task, TaskOptions

if TYPE_CHECKING:
    from pathlib import Path

    from ortft.tasks.protocols import EmbedsTexts, ExportsPlainEncoders, OwnsFolders

__all__ = [
    "BUILTIN",
    "Encoded",
    "ExportKind",
    "Task",
    "TaskOptions",
    "embedder",
    "exporting",
    "folder_family",
    "from_architecture",
    "get",
    "implementing",
    "names",
    "options",
    "options_model",
    "owner_of",
    "plain_encoder",
    "register",
]

# One line per task: its name -> the module that defines ``Options`` and ``build`` (or a family
# package whose ``TASKS`` table holds them).
BUILTIN = {
    "sequence-classification": "ortft.families.text",
    "causal-lm": "ortft.families.generation",
    "token-classification": "ortft.families.text",
    "masked-lm": "ortft.families.text",
    "seq2seq": "ortft.families.generation",
    "question-answering": "ortft.families.text",
    "instruction": "ortft.families.generation",
    "image-classification": "ortft.families.vision",
    "speech-recognition": "ortft.families.speech",
    "sentence-embedding": "ortft.families.embedding",
    "text-to-image": "ortft.families.text_to_image",
    "preference": "ortft.families.preference",
    "reward-model": "ortft.families.preference",
    "image-text-to-text": "ortft.families.vision_language",
}


@dataclass(frozen=True)
class Registration:
    options: type[TaskOptions]  # the pydantic model of its `task:` options
    factory: Callable[[Any], Task]  # options -> the task


# name -> a module path (not imported yet) or its registration; insertion order is list order
_tasks: dict[str, str | Registration] = dict(BUILTIN)


def register(name: str, options: type[TaskOptions], factory: Callable[[Any], Task]) -> None:
    """Add (or replace) a task: ``options`` its options model, ``factory(options)`` builds it."""
    field = options.model_fields.get("name")
    if field is None or name not in getattr(field.annotation, "__args__", (name,)):
        raise ValueError(f"{options.__name__}.name must be Literal[{name!r}]")
    _tasks[name] = Registration(options, factory)


def names() -> list[str]:
    """The registered task names, built-in ones first."""
    return list(_tasks)


def _registration(name: str) -> Registration:
    entry = _tasks.get(name)
    if entry is None:
        raise ValueError(f"unknown task {name!r} (one of: {', '.join(_tasks)})")
    if isinstance(entry, str):
        module = importlib.import_module(entry)
        table = getattr(module, "TASKS", None)  # a family of several tasks: each one's pair
        options, build = table[name] if table is not None else (module.Options, module.build)
        entry = _tasks[name] = Registration(options, build)
    return entry


def options_model(name: str) -> type[TaskOptions]:
    return _registration(name).options


def options(name: str, **values: Any) -> TaskOptions:
    """The validated options of task ``name`` (its defaults, updated with ``values``)."""
    return options_model(name).model_validate({"name": name, **values})


def owner_of(option: str, besides: str = "") -> str | None:
    """The first registered task (other than ``besides``) with an option called ``option``."""
    for name in _tasks:
        if name != besides and option in options_model(name).model_fields:
            return name
    return None


def get(name: str, section: Any = None) -> Task:
    """The task called ``name``, built from ``section`` (the recipe's ``task:``; default: the
    task's default options). A mapping is validated first."""
    reg = _registration(name)
    if section is None or isinstance(section, dict):
        section = reg.options.model_validate({"name": name, **(section or {})})
    return reg.factory(section)


def implementing(protocol: type) -> list[Task]:
    """Each registered task, built with its default options, that implements ``protocol`` (one
    of ``ortft.tasks.protocols``); a task whose options have no defaults cannot be built so,
    and is left out."""
    from pydantic import ValidationError

    found = []
    for name in _tasks:
        try:
            task = get(name)
        except ValidationError:
            continue
        if isinstance(task, protocol):
            found.append(task)
    return found


def folder_family(*folders: Path) -> OwnsFolders | None:
    """The family that owns the first of ``folders`` one of its own holds (a saved model of its
    own layout, found before any config.json is read: ``protocols.OwnsFolders``), or None."""
    from ortft.tasks.protocols import OwnsFolders

    owners = cast("list[OwnsFolders]", implementing(OwnsFolders))
    for folder in folders:
        for task in owners:
            if task.owns_folder(folder):
                return task
    return None


def embedder(source: Path) -> EmbedsTexts | None:
    """The family whose model ``source`` is, when it embeds texts (a run, a model folder or an
    ONNX export: ``protocols.EmbedsTexts``), or None."""
    from ortft.tasks.protocols import EmbedsTexts

    for task in cast("list[EmbedsTexts]", implementing(EmbedsTexts)):
        if task.embeds(source):
            return task
    return None


def plain_encoder(config: Any) -> ExportsPlainEncoders | None:
    """The family that exports a saved model of ``config`` that no recipe describes, a text
    encoder without a task head (``protocols.ExportsPlainEncoders``), or None."""
    from ortft.tasks.protocols import ExportsPlainEncoders

    for task in cast("list[ExportsPlainEncoders]", implementing(ExportsPlainEncoders)):
        if task.plain_encoder(config):
            return task
    return None


def exporting(name: str, section: Any = None) -> Task:
    """The task an export called ``name`` is written for: the registered task (``get``), or
    the one a family exports a plain encoder as (``ExportsPlainEncoders.plain_task``)."""
    from ortft.tasks.protocols import ExportsPlainEncoders

    if name not in _tasks:
        for task in cast("list[ExportsPlainEncoders]", implementing(ExportsPlainEncoders)):
            plain = task.plain_task()
            if plain.name == name:
                return plain
    return get(name, section)


def from_architecture(config: Any) -> str:
    """The task a saved model's architecture name implies (first match wins).

    Only a fallback, for a plain Hugging Face model that no ortft recipe describes: a run's
    own task (its recipe) always wins, since an architecture cannot tell e.g. an instruction
    run from a causal-lm one.
    """
    from ortft.core.errors import InputError
    from ortft.tasks.traits import hf_architectures

    archs = " ".join(getattr(config, "architectures", None) or [])
    for name in _tasks:
        if any(marker in archs for marker in hf_architectures(get(name))):
            return name
    raise InputError(
        f"unsupported model: cannot export a {archs or 'model without architectures'} "
        f"(supported: *ForSequenceClassification, *ForTokenClassification, "
        f"*ForQuestionAnswering, *ForMaskedLM, *ForCausalLM / *LMHeadModel, "
        f"*ForImageClassification)"
    )
