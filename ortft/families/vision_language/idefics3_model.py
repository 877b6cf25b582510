"""Idefics3 (SmolVLM's architecture) as training runs it: its processor and config for a model
built from a config, the vision model's features and the connector that projects them.

An Idefics3 model is a SigLIP-style vision model, a connector (a pixel shuffle of
``scale_factor``^2 patches into one token, then a linear projection) and a Llama text model.
Its ``Idefics3Processor`` expands each ``<image>`` of a text into
``<fake_token_around_image><global-img>`` + ``image_seq_len`` image tokens +
``<fake_token_around_image>`` for an image taken whole. Training takes every image whole
(``do_image_splitting`` off, for a pretrained processor too): each row has one tile of
``max_image_size``, so each row's expansion is the same and a batch needs no padding tiles.
A pretrained SmolVLM processor splits large images into tiles; its ``final/`` then keeps
splitting off, as it was trained.

The vision model's forward is ``idefics3_graphs.VisionEncoder.encode`` (the positions as an
ONNX graph holds them), so the tower trains inside ORTModule with ``task.freeze_vision=false``
and gives the same features as transformers' (a test checks the logits).
"""

from __future__ import annotations

import logging
from typing import Any

from ortft.core.errors import InputError
from ortft.families.vision_language.model import Common

log = logging.getLogger("ortft")

SCALE_FACTOR = 2  # a from_config model's pixel shuffle: 2 x 2 patches a token
GLOBAL_IMAGE = "<global-img>"  # Idefics3Processor reads its id but does not add it
# The processor adds <fake_token_around_image>, <image> and <end_of_utterance> itself.
# A user turn's parts in order, <end_of_utterance> after it; an assistant turn's text then
# end-of-sequence: the model learns to stop. ``add_generation_prompt`` opens the assistant turn.
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] | capitalize }}:"
    "{% if message['content'] is string %} {{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<image>{% elif part['type'] == 'text' %}"
    " {{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% else %}<end_of_utterance>"
    "{% endif %}{{ '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)


class Idefics3(Common):
    """``archs.Arch`` for ``Idefics3ForConditionalGeneration``."""

    model_type = "idefics3"
    language = "text_model"
    projector = "connector"
    pixel_keys: tuple[str, ...] = ("pixel_values", "pixel_attention_mask")

    def vision_parameters(self, model: Any) -> list[Any]:
        return list(model.model.vision_model.parameters())

    def for_config(self, options: Any, tokenizer: Any) -> Any:
        """An ``Idefics3Processor``: Idefics3's image processor (PIL) taking each image whole
        at ``task.image_size``, ``tokenizer`` with the image tokens, ``CHAT_TEMPLATE``."""
        from transformers import Idefics3Processor
        from transformers.models.idefics3 import Idefics3ImageProcessorPil

        from ortft.families.vision_language.processor import with_image_token

        side = options.image_size
        images = Idefics3ImageProcessorPil(
            size={"longest_edge": side},
            max_image_size={"longest_edge": side},
            do_image_splitting=False,
        )
        tokenizer = with_image_token(tokenizer)
        tokenizer.add_special_tokens({"additional_special_tokens": [GLOBAL_IMAGE]})
        return Idefics3Processor(
            image_processor=images,
            tokenizer=tokenizer,
            image_seq_len=seq_len(options),
            chat_template=CHAT_TEMPLATE,
        )

    def ready(self, processor: Any) -> Any:
        """A loaded processor as training uses it: each image whole (see the module doc)."""
        images = processor.image_processor
        if images.do_image_splitting:
            log.info(
                "idefics3: image splitting off (each image one %s-pixel tile); final/ keeps it off",
                images.max_image_size.get("longest_edge"),
            )
        images.do_image_splitting = False
        return processor

    def model_config(self, spec: Any, options: Any, tokenizer: Any, dropout: float | None) -> Any:
        """An ``Idefics3Config``: the vision model from the task's ``vision_*`` options, the
        connector's pixel shuffle by ``SCALE_FACTOR``, a Llama text model with
        ``model.from_config``'s sizes."""
        from transformers import Idefics3Config

        from ortft.backends.torch import hf_config

        seq_len(options)  # the grid must shuffle evenly
        text = hf_config.generic_config(
            spec.model_copy(update={"architecture": "llama"}), tokenizer, dropout
        )
        vision = dict(
            hidden_size=options.vision_hidden_size,
            intermediate_size=4 * options.vision_hidden_size,
            num_hidden_layers=options.vision_layers,
            num_attention_heads=options.vision_heads,
            image_size=options.image_size,
            patch_size=options.patch_size,
        )
        return Idefics3Config(
            vision_config=vision,
            text_config=text.to_dict(),
            scale_factor=SCALE_FACTOR,
            image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
            tie_word_embeddings=text.tie_word_embeddings,
        )

    def vision_features(self, model: Any, pixels: dict[str, Any]) -> Any:
        """The vision model's last hidden states [rows, patches, hidden] of each row's one
        tile (``pixel_values`` [rows, 1, 3, H, W]; ``pixel_attention_mask`` [rows, 1, H, W])."""
        from ortft.families.vision_language.idefics3_graphs import VisionEncoder

        values = pixels["pixel_values"]
        _, _, channels, height, width = values.shape
        flat = values.reshape(-1, channels, height, width)
        mask = pixels.get("pixel_attention_mask")
        encoder = VisionEncoder(model)
        p = encoder.patch
        if mask is None:
            patches = flat.new_ones((flat.shape[0], height // p, width // p), dtype=bool)
        else:
            grid = mask.reshape(-1, height // p, p, width // p, p).long()
            patches = grid.sum(dim=(2, 4)) > 0  # a patch is real where any of its pixels is
        return encoder.encode(flat, patches)

    def project(self, model: Any, features: Any) -> Any:
        return model.model.connector(features)


def seq_len(options: Any) -> int:
    """Image tokens a tile gives: (side / patch)^2 / SCALE_FACTOR^2."""
    side = options.image_size // options.patch_size
    if options.image_size % options.patch_size or side % SCALE_FACTOR:
        raise InputError(
            f"task.image_size={options.image_size}, task.patch_size={options.patch_size}: "
            f"idefics3 needs a grid of patches whose side ({side}) is a multiple of "
            f"{SCALE_FACTOR} (its pixel shuffle)"
        )
    return (side // SCALE_FACTOR) ** 2
