"""The vision-language architectures training knows, keyed by the config's ``model_type``: what
differs between them (the processor and config a from_config model gets, the vision tower, its
features, the projector, the language model's module name) behind ``Arch``; the task, the
model's forward and the family call these and never compare a type themselves."""

from __future__ import annotations

from typing import Any, Protocol

from ortft.core.errors import InputError
from ortft.families.vision_language.idefics3_model import Idefics3


class Arch(Protocol):
    model_type: str
    language: str  # the language model's module name (LoRA's targets are inside it)
    projector: str  # the module LoRA leaves trainable in full

    def tower(self, model: Any) -> Any:
        """The vision tower (frozen by ``task.freeze_vision``)."""
        ...

    def for_config(self, options: Any, tokenizer: Any) -> Any:
        """The processor of a from_config model around ``tokenizer``."""
        ...

    def ready(self, processor: Any) -> Any:
        """A loaded processor as training uses it."""
        ...

    def model_config(
        self, spec: Any, options: Any, tokenizer: Any, dropout: float | None
    ) -> Any: ...

    def vision_features(self, model: Any, pixels: dict[str, Any]) -> Any:
        """The vision tower's features the projector takes, of the collated pixel inputs."""
        ...

    def project(self, model: Any, features: Any) -> Any:
        """The projector's output: one row of the language model's width per image token."""
        ...


class Llava:
    """``Arch`` for ``LlavaForConditionalGeneration`` (``processor``, ``model``)."""

    model_type = "llava"
    language = "language_model"
    projector = "multi_modal_projector"

    def tower(self, model: Any) -> Any:
        return model.model.vision_tower

    def for_config(self, options: Any, tokenizer: Any) -> Any:
        from ortft.families.vision_language import processor

        return processor.for_config(options, tokenizer)

    def ready(self, processor: Any) -> Any:
        return processor

    def model_config(self, spec: Any, options: Any, tokenizer: Any, dropout: float | None) -> Any:
        from ortft.families.vision_language import processor

        return processor.model_config(spec, options, tokenizer, dropout)

    def vision_features(self, model: Any, pixels: dict[str, Any]) -> Any:
        from ortft.families.vision_language.model import vision_features

        return vision_features(model, pixels["pixel_values"])

    def project(self, model: Any, features: Any) -> Any:
        return model.model.multi_modal_projector(features)


ARCHS: dict[str, Arch] = {a.model_type: a for a in (Llava(), Idefics3())}


def named(architecture: str) -> Arch:
    """The ``Arch`` of ``model.from_config.architecture``; an InputError naming the field."""
    if architecture not in ARCHS:
        raise InputError(
            f"model.from_config.architecture={architecture}: image-text-to-text builds "
            f"{' or '.join(ARCHS)} from a config; a pretrained model loads from "
            "model.name_or_path"
        )
    return ARCHS[architecture]


def of(model: Any) -> Arch:
    """The ``Arch`` of a built model (its config's ``model_type``)."""
    base = getattr(model, "get_base_model", None)  # the model inside a peft wrapper
    config = (base() if base is not None else model).config
    kind = getattr(config, "model_type", None)
    if kind not in ARCHS:
        raise InputError(
            f"model: image-text-to-text trains {', '.join(ARCHS)} models, not {kind} "
            f"({type(model).__name__})"
        )
    return ARCHS[kind]


def of_processor(processor: Any) -> Arch:
    """The ``Arch`` of a loaded processor (``IdeficsProcessor`` -> idefics3)."""
    name = type(processor).__name__.lower()
    for kind, arch in ARCHS.items():
        if name.startswith(kind.replace("_", "")):
            return arch
    raise InputError(
        f"model: image-text-to-text trains {', '.join(ARCHS)} models; the processor is a "
        f"{type(processor).__name__}"
    )
