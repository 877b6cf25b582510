"""The vision-language architectures training knows, keyed by the config's ``model_type``: what
differs between them (the processor and config a from_config model gets, the vision tower, its
features, the projector, the language model's module name, a batch's pixel arrays, an image's
tokens, the inputs computed before the wrapped module, the forward) behind ``Arch``; the task,
the model's forward and the family call these and never compare a type themselves. LLaVA and
Idefics3 share the defaults of ``model.Common``; Qwen2-VL (``qwen2vl_model.Qwen2VL``) has its
own grid, rope positions and forward."""

from __future__ import annotations

from typing import Any, Protocol

from ortft.core.errors import InputError
from ortft.families.vision_language.idefics3_model import Idefics3
from ortft.families.vision_language.model import Common
from ortft.families.vision_language.qwen2vl_model import Qwen2VL


class Arch(Protocol):
    model_type: str
    language: str  # the language model's module name (LoRA's targets are inside it)
    projector: str  # the module LoRA leaves trainable in full
    pixel_keys: tuple[str, ...]  # a collated batch's image arrays (``pixels``)

    def vision_parameters(self, model: Any) -> list[Any]:
        """What ``task.freeze_vision`` freezes: the vision tower (not the projector)."""
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

    def pixels(self, processor: Any, decoded: list[Any]) -> dict[str, Any]:
        """The arrays (``pixel_keys``) of a batch's decoded images, batch-first."""
        ...

    def expansion(self, processor: Any, path: str | None) -> list[int] | None:
        """The ids ``path``'s image token expands into where they depend on the image (its
        grid); None where every image expands alike (``processor.image_expansion``)."""
        ...

    def extra_inputs(self, model: Any, inputs: dict[str, Any]) -> dict[str, Any]:
        """Inputs of the wrapped module computed eagerly before it, under no_grad, from the
        batch (Qwen2-VL's ``rope_positions``): what no exporter can trace."""
        ...

    def forward(
        self,
        model: Any,
        input_ids: Any,
        attention_mask: Any,
        labels: Any,
        inputs: dict[str, Any],
        image_features: Any,
    ) -> tuple[Any, Any]:
        """(loss, logits) of a batch; ``inputs``: its pixel arrays and ``extra_inputs``."""
        ...

    def model_inputs(self, model: Any, ids: Any, vision: dict[str, Any]) -> dict[str, Any]:
        """What transformers' own forward and ``generate`` take besides the ids, from a
        batch's image arrays."""
        ...

    def card(self) -> str:
        """The export card's snippet, with ``{question}`` to fill (``exporting.card``)."""
        ...

    def onnx_feeds(self, vision: dict[str, Any]) -> dict[str, Any]:
        """The export's vision graph's feeds of a batch's image arrays."""
        ...

    def onnx_steps(self, sessions: Any, config: Any, feeds: dict[str, Any]) -> Any:
        """The export's decoding steps (``vlm_graphs.Steps``) of one batch's vision feeds."""
        ...

    def onnx_positions(self, ids: Any, mask: Any, feeds: dict[str, Any], config: Any) -> Any:
        """The export's decoder's ``position_ids`` of a right-padded batch."""
        ...


class Llava(Common):
    """``Arch`` for ``LlavaForConditionalGeneration`` (``processor``, ``model``)."""

    model_type = "llava"
    language = "language_model"
    projector = "multi_modal_projector"
    pixel_keys: tuple[str, ...] = ("pixel_values",)

    def vision_parameters(self, model: Any) -> list[Any]:
        return list(model.model.vision_tower.parameters())

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


ARCHS: dict[str, Arch] = {a.model_type: a for a in (Llava(), Idefics3(), Qwen2VL())}


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
    return of_type(getattr(config, "model_type", None), f" ({type(model).__name__})")


def of_type(kind: Any, what: str = "") -> Arch:
    """The ``Arch`` of a config's ``model_type`` (an export's, or its report's)."""
    if kind not in ARCHS:
        raise InputError(
            f"model: image-text-to-text trains {', '.join(ARCHS)} models, not {kind}{what}"
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
