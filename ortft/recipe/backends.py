"""What each backend accepts of a recipe: torch-free checks by ``backend.name``, run when the
recipe is validated, before any framework is imported. They never ask what is installed (a
recipe means the same on every install): ``check_installed`` does that as a run starts.

The engines themselves live in ``ortft.backends``; their names are listed here because the
recipe chooses among them. ``ortft.backends.register`` adds a name (a plugin's engine, with no
checks of its own) through ``allow``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from pydantic import Field

from ortft import tasks
from ortft.core.errors import RecipeError
from ortft.env import ort_training
from ortft.tasks import traits

# backend.* fields that configure ORTModule: set on another backend they would do nothing
ORTMODULE_FIELDS = (
    "allow_fallback",
    "log_level",
    "save_onnx",
    "memory_optimization_level",
    "compute_optimizer",
    "pytorch_kernels",
    "gpu_allocator",
)


# backend.compile: the field lives in schema.BackendSection; its type and text are here
Compile = Literal[False, True, "auto"]
COMPILE_DESCRIPTION = (
    "Train the torch backend through torch.compile (inductor, dynamic shapes: one compile "
    "serves every batch length). true: always; false: eager PyTorch; auto: the backend.name=auto "
    "probe (or, with backend.name=torch, a probe of eager against compiled) times both and "
    "counts the compile time against the run's steps, skipping the compiled route when the run "
    "is too short for it to pay back. The first step pays the compile (minutes on a 2-core "
    "CPU with an empty cache, under one from the cache: kernels are kept in "
    "${ORTFT_CACHE:-~/.cache/ortft}/inductor). torch and auto only (docs/backends.md)."
)


def compile_field() -> Any:
    return Field(False, description=COMPILE_DESCRIPTION)


def compile_problems(recipe: Any) -> list[str]:
    """backend.compile where torch.compile cannot go (torch-free)."""
    value, name = recipe.backend.compile, recipe.backend.name
    if value is False:
        return []
    setting = f"backend.compile={str(value).lower()}"
    if name in ("ort", "ort-ondevice"):
        return [f"{setting} compiles the torch backend: use backend.name=torch or auto"]
    if recipe.deepspeed is not None:
        # DeepSpeed's engine owns the forward (its own hooks and casts around the module);
        # compiling through it is not measured here
        return [f"{setting} with deepspeed: DeepSpeed runs eager; use backend.compile=false"]
    return []


# backend.pytorch_kernels' names (backends/ortmodule/kernels.py routes each)
PytorchKernel = Literal["gelu", "layer_norm", "cross_entropy", "dropout", "conv", "index_select"]

# backend.unpad: the field lives in schema.BackendSection; its type and text are here
Unpad = Literal[False, True, "auto"]
UNPAD_DESCRIPTION = (
    "The torch and ort backends run the transformer's per-position layers (Linear, BERT-style "
    "feed-forward and output blocks, a decoder's MLP) on the real tokens only, skipping the "
    "padding, in training forwards (ort: as gathers inside ORTModule's graph): the same values "
    "at every real token. auto: on a CPU, where it applies (backend torch, not compiled; an "
    "encoder or decoder of a listed type, a task that reads no padded position: "
    "classification, token classification, masked-lm, sentence embeddings, causal-lm, "
    "instruction, preference; on a GPU no gain was measured); the ort backend stays padded "
    "under auto. true: on, on torch or ort, also on a GPU (an error where it cannot apply); "
    "false: off (docs/backends.md)."
)


def unpad_field() -> Any:
    return Field("auto", description=UNPAD_DESCRIPTION)


def unpad_problems(recipe: Any) -> list[str]:
    """backend.unpad=true where it cannot apply, as far as the recipe tells (torch-free; the
    model's type is checked when it loads)."""
    if recipe.backend.unpad is not True:
        return []
    why = []
    if recipe.backend.name not in ("torch", "ort"):
        why.append("it is the torch and ort backends' (set backend.name=torch or ort)")
    if recipe.backend.compile is not False:
        why.append("a compiled forward would recompile for every batch (backend.compile=false)")
    if not traits.pads_unread(tasks.get(recipe.task.name)):  # default options do
        why.append(f"task {recipe.task.name} reads padded positions")
    return [f"backend.unpad=true: {w}" for w in why]


# backend.dropout_masks: the field lives in schema.BackendSection; its type and text are here
DropoutMasks = Literal["auto", "torch", "int16"]
DROPOUT_MASKS_DESCRIPTION = (
    "Where the torch backend's training dropout draws its keep-masks. torch: torch's own "
    "dropout (bernoulli_). int16 (on a CPU; a GPU keeps torch's): 16 random bits an element, "
    "from numpy's SFC64 generator seeded at each call by torch's CPU generator, kept where the "
    "16-bit integer clears the threshold (the keep-probability rounded to 2^-16, at most "
    "7.6e-6 off, and the kept values scaled by its inverse); checkpoints save torch's "
    "generator, so resuming draws the same masks. auto: int16 on a CPU with torch 2.7 or "
    "later, whose CPU bernoulli_ is taken to draw without MKL (2.6 draws with it; on torch "
    "2.13 dropout's masks took 16-20% of an encoder's bf16 step), torch elsewhere. Eager "
    "forwards only: not with backend.compile, gradient checkpointing or deepspeed "
    "(docs/backends.md)."
)


def dropout_masks_field() -> Any:
    return Field("auto", description=DROPOUT_MASKS_DESCRIPTION)


def dropout_masks_problems(recipe: Any) -> list[str]:
    """backend.dropout_masks=int16 where the torch backend's eager forward does not run it."""
    if recipe.backend.dropout_masks != "int16":
        return []
    why = []
    if recipe.backend.name not in ("torch", "auto"):
        why.append("it is the torch backend's (set backend.name=torch or auto)")
    if recipe.backend.compile is True:
        why.append("a compiled forward draws its own masks (backend.compile=false)")
    if recipe.hardware.gradient_checkpointing:
        why.append("gradient checkpointing recomputes the forward with torch's masks")
    if recipe.deepspeed is not None:
        why.append("DeepSpeed's engine runs the forward")
    return [f"backend.dropout_masks=int16: {w}" for w in why]


def ortmodule_fields_set(recipe: Any) -> list[str]:
    """The ORTModule-only backend fields this recipe sets to other than their defaults."""
    section = recipe.backend
    fields = type(section).model_fields
    return [f"backend.{k}" for k in ORTMODULE_FIELDS if getattr(section, k) != fields[k].default]


def torch_problems(recipe: Any) -> list[str]:
    """What backend.name=torch refuses (torch-free: the recipe is validated before torch loads)."""
    problems = [
        f"{name} configures ORTModule (backend.name=ort or auto), not backend.name=torch"
        for name in ortmodule_fields_set(recipe)
    ]
    if recipe.optimizer.name == "adamw_ort_fused":
        problems.append("optimizer.name=adamw_ort_fused needs backend.name=ort")
    return problems


def ort_problems(recipe: Any) -> list[str]:
    """What ORTModule (backend.name=ort, and auto, which may choose it) refuses; torch-free."""

    dtype, device, name = recipe.precision.dtype, recipe.hardware.device, recipe.backend.name
    problems = []
    if dtype == "bf16" and device == "cpu":
        problems.append(
            "precision.dtype=bf16 on cpu needs backend.name=torch: ONNX Runtime's CPU "
            "provider has no bf16 MatMul"
        )
    if recipe.hardware.gradient_checkpointing:
        problems.append(
            "hardware.gradient_checkpointing is for backend.name=torch: ORTModule builds "
            "its own backward graph, so it would save nothing; use "
            "backend.memory_optimization_level=1 (or 2) instead"
        )
    if recipe.optimizer.name == "adamw_ort_fused" and name != "ort":
        problems.append("optimizer.name=adamw_ort_fused needs backend.name=ort")
    if name == "ort" and recipe.adapter is not None and recipe.adapter.kind == "dora":
        problems.append(
            "adapter.kind=dora needs backend.name=torch: ORTModule cannot build DoRA's "
            "backward (its ReduceL2 gradient, of the weight norm, is an invalid graph)"
        )
    if name == "auto" and recipe.adapter is not None:
        problems.append(
            "adapter: backend.name=auto times full fine-tuning, not the adapter; "
            "choose backend.name=ort or torch"
        )
    return problems


def ondevice_problems(r: Any) -> list[str]:
    """What backend.name=ort-ondevice supports; the rest is a recipe error, never a no-op."""
    problems = []
    if not traits.ondevice(tasks.get(r.task.name, r.task)):
        supported = [n for n in tasks.names() if traits.ondevice(tasks.get(n))]
        problems.append(f"task {r.task.name} (supported: {', '.join(supported)})")
    if r.model.from_config and r.model.from_config.architecture == "t5":
        problems.append("model.from_config.architecture=t5 (bert and gpt2 are measured)")
    if r.adapter is not None:
        problems.append("adapter (use backend.trainable to train part of the model)")
    if r.training.early_stopping is not None or r.checkpoint.final == "best":
        problems.append("training.early_stopping / checkpoint.final=best")
    if r.optimizer.name != "adamw":
        problems.append(f"optimizer.name={r.optimizer.name} (ORT's AdamW graph is used)")
    if r.precision.dtype not in ("fp32", "auto"):  # auto: fp32 here, with that reason
        problems.append(f"precision.dtype={r.precision.dtype} (ort-ondevice trains in fp32 only)")
    if r.hardware.gradient_checkpointing:
        problems.append("hardware.gradient_checkpointing (a PyTorch feature)")
    problems += [f"{name} (an ORTModule setting)" for name in ortmodule_fields_set(r)]
    if r.deepspeed is not None:
        problems.append("deepspeed (one process, ORT's own optimizer)")
    if problems:
        return ["backend.name=ort-ondevice does not support " + "; ".join(problems)]
    return []


# backend.name -> its checks; "auto" may choose ORTModule, so it gets ort's
RULES: dict[str, Callable[[Any], list[str]]] = {
    "ort": ort_problems,
    "torch": torch_problems,
    "auto": ort_problems,
    "ort-ondevice": ondevice_problems,
}
_REGISTERED: list[str] = []


def check_installed(recipe: Any) -> None:
    """Refuse a backend this install cannot train with (one line, exit 2): called as a run
    starts, before any data is read or model built."""
    problem = ort_training.backend_problem(recipe.backend.name)
    if problem is not None:
        raise RecipeError(problem)


def allow(name: str) -> None:
    """Accept ``backend.name: <name>`` for an engine registered from outside ortft."""
    if name not in RULES and name not in _REGISTERED:
        _REGISTERED.append(name)


def names() -> list[str]:
    """Every backend.name a recipe may use: the built-in ones, then registered ones."""
    return [*RULES, *_REGISTERED]


def problems(recipe: Any) -> list[str]:
    """What the recipe's backend cannot do (none for a registered engine)."""
    check = RULES.get(recipe.backend.name)
    own = check(recipe) if check is not None else []
    return compile_problems(recipe) + unpad_problems(recipe) + dropout_masks_problems(recipe) + own
