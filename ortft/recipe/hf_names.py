"""Which transformers ``model_type``s each Auto class builds, read without importing transformers.

``model.from_config.architecture`` takes any model type whose Auto class fits the task (a
task's ``auto_class``). The names live in ``transformers.models.auto.modeling_auto``'s
``*_MAPPING_NAMES`` dicts, but importing that module imports torch (1.3 s measured, torch 2.6 /
transformers 5.24), and ``ortft validate`` stays torch-free. So the dicts are read from the
module's source with ``ast`` (about 40 ms, once per process); only if that source no longer
has the expected shape is the module imported.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
from pathlib import Path

SEQ2SEQ_CLASS = "AutoModelForSeq2SeqLM"


@functools.cache
def model_types(auto_class: str) -> tuple[str, ...]:
    """The model types ``transformers.<auto_class>`` builds, sorted ("" -> none)."""
    try:
        names = _parsed(auto_class)
    except (OSError, SyntaxError, KeyError, ValueError):
        names = None
    if names is None:  # the source changed shape: ask the module itself (imports torch)
        import transformers

        names = list(getattr(transformers, auto_class)._model_mapping._model_mapping)
    return tuple(sorted(set(names)))


def encoder_decoders() -> frozenset[str]:
    """Model types with a decoder fed by an encoder (what AutoModelForSeq2SeqLM builds)."""
    return frozenset(model_types(SEQ2SEQ_CLASS))


def fitting(auto_class: str) -> tuple[str, ...]:
    """Model types a task built with ``auto_class`` can train. Encoder-decoders fit only
    seq2seq: every other task feeds no decoder inputs, and their classification / QA heads
    then build a decoder input the task does not control (t5, bart, ...)."""
    types = model_types(auto_class)
    if auto_class == SEQ2SEQ_CLASS:
        return types
    pairs = encoder_decoders()
    return tuple(t for t in types if t not in pairs)


@functools.lru_cache(maxsize=1)
def _tree() -> ast.Module:
    spec = importlib.util.find_spec("transformers")  # finds the package, runs none of it
    if spec is None or not spec.submodule_search_locations:
        raise OSError("transformers is not installed")
    root = Path(next(iter(spec.submodule_search_locations)))
    source = (root / "models" / "auto" / "modeling_auto.py").read_text(encoding="utf-8")
    return ast.parse(source)


def _parsed(auto_class: str) -> list[str] | None:
    """``class <auto_class>: _model_mapping = X``; ``X = _LazyAutoMapping(CONFIG..., Y)``;
    ``Y = OrderedDict([(model_type, class_name), ...])`` -> the model types of Y."""
    assigns: dict[str, ast.expr] = {}
    mapping = None
    for node in _tree().body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            assigns[node.targets[0].id] = node.value
        elif isinstance(node, ast.ClassDef) and node.name == auto_class:
            for item in node.body:
                if (
                    isinstance(item, ast.Assign)
                    and isinstance(item.targets[0], ast.Name)
                    and item.targets[0].id == "_model_mapping"
                    and isinstance(item.value, ast.Name)
                ):
                    mapping = item.value.id
    lazy = assigns.get(mapping or "")
    if not (isinstance(lazy, ast.Call) and len(lazy.args) == 2):
        return None
    names_var = lazy.args[1]
    ordered = assigns.get(names_var.id) if isinstance(names_var, ast.Name) else None
    if not (isinstance(ordered, ast.Call) and ordered.args):
        return None
    pairs = ast.literal_eval(ordered.args[0])
    return [str(model_type) for model_type, _ in pairs]


# The Auto classes whose union is "every model type": a name in none of them is no model type.
_ALL_CLASSES = (
    "AutoModel",
    "AutoModelForCausalLM",
    "AutoModelForMaskedLM",
    "AutoModelForSeq2SeqLM",
    "AutoModelForSequenceClassification",
    "AutoModelForTokenClassification",
    "AutoModelForQuestionAnswering",
    "AutoModelForImageClassification",
)


def known() -> frozenset[str]:
    """Every model type the usual Auto classes build (to tell a typo from a misfit)."""
    return frozenset(t for c in _ALL_CLASSES for t in model_types(c))
