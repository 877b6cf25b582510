"""The LLaVA processor: what a vision-language run loads where a text task loads its tokenizer.

A ``LlavaProcessor`` holds the image processor (CLIP's, on its PIL backend: torchvision is not
installed, and training, ``ortft predict`` and ``final/`` must see the same pixels), the
tokenizer with the image token, and the chat template. It expands each image token of a text
into one token per image feature the vision tower gives (``image_tokens``). Saved in the run's
``processor/`` and in ``final/``, where ``AutoProcessor`` loads it.

A model built ``from_config`` gets:
- a byte-level BPE tokenizer trained on the rows' texts (``model.tokenizer.train``) or loaded
  (``model.tokenizer.path``), with ``<image>`` added as a special token;
- CLIP's image processor sized to ``task.image_size`` (resize the shortest edge, centre crop;
  CLIP's mean and std);
- ``CHAT_TEMPLATE``: ``USER: <image>\\n{question}\\nASSISTANT: {answer}<eos>\\n``;
- a ``LlavaConfig`` (``model_config``): a CLIP vision tower from the task's ``vision_*``
  options, the two-layer GELU projector, and a Llama language model with
  ``model.from_config``'s sizes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ortft.core.errors import InputError, first_line
from ortft.recipe.io import LoadedRecipe

IMAGE_TOKEN = "<image>"
FILES = ("processor_config.json", "preprocessor_config.json")
# A user turn's parts in order (an image part is the image token), an assistant turn's text then
# end-of-sequence: the model learns to stop. ``add_generation_prompt`` opens the assistant turn.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}USER: {% elif message['role'] == 'assistant' %}"
    "ASSISTANT: {% else %}{{ message['role'] | upper }}: {% endif %}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<image>{{ '\\n' }}{% elif part['type'] == 'text' %}"
    "{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}{{ '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT: {% endif %}"
)


def load(loaded: LoadedRecipe, source: str | None, saved_dir: Path | None) -> Any:
    """The processor of ``saved_dir`` (a resumed run) or of the model folder ``source``; None
    where the model is built from a config (``for_config`` then)."""
    folder = str(saved_dir) if saved_dir else source
    if folder is None:
        return None
    field = str(saved_dir) if saved_dir else "model.name_or_path"
    if Path(folder).is_dir() and not any((Path(folder) / f).exists() for f in FILES):
        raise InputError(
            f"{field}: {folder} has no {' or '.join(FILES)} (a vision-language model needs "
            "its processor)"
        )
    return from_folder(folder, field, loaded.recipe.model.trust_remote_code)


def from_folder(folder: str, field: str = "model", trust_remote_code: bool = False) -> Any:
    """``AutoProcessor`` of ``folder`` on its PIL backend: an image processor, a tokenizer
    with an image token and a chat template (a Qwen2-VL folder: ``qwen2vl_model.from_folder``,
    which AutoProcessor cannot load without torchvision)."""
    from transformers import AutoProcessor

    from ortft.families.vision_language import qwen2vl_model

    if qwen2vl_model.is_folder(folder):
        return qwen2vl_model.from_folder(folder, field)
    try:
        processor = AutoProcessor.from_pretrained(
            folder, backend="pil", trust_remote_code=trust_remote_code
        )
    except (OSError, ValueError, KeyError, TypeError) as err:
        first = first_line(err)
        raise InputError(f"{field}: {folder}: cannot load the processor ({first})") from None
    missing = [
        what
        for what in ("image_processor", "tokenizer", "image_token", "chat_template")
        if getattr(processor, what, None) is None
    ]
    if missing:
        raise InputError(
            f"{field}: {folder}: not a vision-language processor ({type(processor).__name__} "
            f"has no {', '.join(missing)})"
        )
    return processor


def with_image_token(tokenizer: Any) -> Any:
    """``tokenizer`` with ``<image>`` as a special token and a pad token."""
    if IMAGE_TOKEN not in tokenizer.get_vocab():
        tokenizer.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if tokenizer.eos_token is None:
        raise InputError("model.tokenizer: the tokenizer has no end-of-sequence token")
    return tokenizer


def for_config(options: Any, tokenizer: Any) -> Any:
    """The ``LlavaProcessor`` of a from_config model: CLIP's image processor (PIL) sized to
    ``task.image_size``, ``tokenizer`` with the image token, ``CHAT_TEMPLATE``."""
    from transformers import LlavaProcessor
    from transformers.models.clip import CLIPImageProcessorPil

    size = options.image_size
    images = CLIPImageProcessorPil(
        size={"shortest_edge": size}, crop_size={"height": size, "width": size}
    )
    return LlavaProcessor(
        image_processor=images,
        tokenizer=with_image_token(tokenizer),
        patch_size=options.patch_size,
        vision_feature_select_strategy="default",  # the CLS feature is left out
        num_additional_image_tokens=1,  # CLIP's CLS
        chat_template=CHAT_TEMPLATE,
        image_token=IMAGE_TOKEN,
    )


def model_config(spec: Any, options: Any, tokenizer: Any, dropout: float | None) -> Any:
    """The ``LlavaConfig`` of a from_config model: a CLIP vision tower (the task's
    ``vision_*`` options, ``image_size``, ``patch_size``), a Llama language model
    (``model.from_config``'s sizes and the tokenizer's ids, ``generic_config``'s path)."""
    from transformers import CLIPVisionConfig, LlavaConfig

    from ortft.backends.torch import hf_config

    if spec.architecture != "llava":
        raise InputError(
            f"model.from_config.architecture={spec.architecture}: image-text-to-text builds "
            "LLaVA-style models from a config (architecture: llava); a pretrained one loads "
            "from model.name_or_path"
        )
    text = hf_config.generic_config(
        spec.model_copy(update={"architecture": "llama"}), tokenizer, dropout
    )
    vision = CLIPVisionConfig(
        hidden_size=options.vision_hidden_size,
        num_hidden_layers=options.vision_layers,
        num_attention_heads=options.vision_heads,
        intermediate_size=4 * options.vision_hidden_size,
        image_size=options.image_size,
        patch_size=options.patch_size,
    )
    return LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        projector_hidden_act="gelu",
        vision_feature_select_strategy="default",
        vision_feature_layer=-1,
    )


def image_expansion(processor: Any) -> list[int]:
    """The ids the processor expands one image token into (LLaVA: one image token per image
    feature; Idefics3: its image markers around them), on a blank image of the processor's
    size. Each image of a run expands alike: LLaVA crops every image to one size, and
    Idefics3's processor takes every image whole (``idefics3_model``)."""
    from PIL import Image

    crop = getattr(processor.image_processor, "crop_size", None) or {}
    size = (int(crop.get("width", 8)), int(crop.get("height", 8)))
    out = processor(
        images=[Image.new("RGB", size)],
        text=[processor.image_token],
        add_special_tokens=False,
        return_tensors="np",
    )
    return [int(t) for t in out["input_ids"][0]]
