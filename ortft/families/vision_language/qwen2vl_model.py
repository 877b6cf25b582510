"""Qwen2-VL as training runs it (``model.from_config.architecture: qwen2_vl``, or a pretrained
Qwen2-VL folder): its processor, its config, the pixels of a batch, the 3-D rotary positions and
the forward the backends wrap, behind ``Qwen2VL``, its row of ``archs.ARCHS``.

- **Processor**: ``Qwen2VLProcessor`` (the PIL image processor; its image token
  ``<|image_pad|>`` between ``<|vision_start|>`` and ``<|vision_end|>``, expanded into
  ``grid_t x grid_h x grid_w / merge_size^2`` tokens per image) with ChatML's chat template.
- **Pixels**: the image processor gives one flat ``pixel_values`` [patches, C x T x P x P] for the
  whole batch and ``image_grid_thw`` [images, 3]; ``collate`` pads each row's patches to the
  batch's most, so every array stays batch-first (eval pads and generate picks rows by index).
- **Positions**: M-RoPE's position ids [3, batch, sequence] come from ``get_rope_index``, a
  Python loop over each row's tokens and grids that no exporter can trace into a graph: they are
  computed eagerly before the wrapped module (``Qwen2VL.extra_inputs``) and fed to it as ``rope_positions``
  [batch, 3, sequence] (batch-first, as every input the backends cut).
- **Vision**: frozen (``task.freeze_vision``, the default), the vision transformer's blocks run
  before the wrapped module under no_grad (on ort: outside ORTModule), with transformers' own
  attention; the **patch merger** (Qwen2-VL's projector: two linear layers from four merged
  patches to the language model's width) runs inside and trains, as LLaVA's projector does: a
  pretrained merger is what adapts the frozen tower's features to the fine-tuned language model.
  Not frozen, the whole vision transformer runs inside, written as tensor ops on the grid
  (``qwen2vl_graphs.VisionEncoder``, the export's graph), so ORTModule can trace it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ortft.core.errors import InputError, first_line

ARCHITECTURE = "qwen2_vl"
PROCESSOR_CLASS = "Qwen2VLProcessor"
IMAGE_TOKEN, VIDEO_TOKEN = "<|image_pad|>", "<|video_pad|>"
VISION_START, VISION_END = "<|vision_start|>", "<|vision_end|>"
TURN_START, TURN_END = "<|im_start|>", "<|im_end|>"
SPECIALS = [TURN_START, TURN_END, VISION_START, VISION_END, IMAGE_TOKEN, VIDEO_TOKEN]
PAD = "<|endoftext|>"
MERGE, TEMPORAL = 2, 2  # Qwen2-VL's spatial merge (2 x 2 patches a token) and frames a patch
# Qwen2-VL's ChatML template without its default system turn ("You are a helpful assistant."):
# ~30 tokens a row for a tokenizer trained on the rows' texts, which never saw it
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def processor_class() -> Any:
    """``Qwen2VLProcessor`` without a video processor. Without torchvision, transformers 5.24
    cannot check a ``video_processor`` argument at all (``VideoProcessorMixin`` is not
    importable), so ``Qwen2VLProcessor(...)`` fails even for ``None``, and so does
    ``AutoProcessor.from_pretrained`` of a Qwen2-VL folder. Training needs only the image
    processor and the tokenizer; the subclass keeps the class name, which the files record
    (whether ``AutoProcessor`` with torchvision reads them is not checked here)."""
    import transformers

    class Qwen2VLProcessor(transformers.Qwen2VLProcessor):
        @classmethod
        def get_attributes(cls) -> list[str]:
            return ["image_processor", "tokenizer"]

        def save_pretrained(self, save_directory: Any, *args: Any, **kwargs: Any) -> Any:
            saved = super().save_pretrained(save_directory, *args, **kwargs)
            write_video_config(self.image_processor, Path(save_directory))
            return saved

    return Qwen2VLProcessor


# what a Qwen2-VL video processor shares with its image processor
VIDEO_KEYS = (
    "do_convert_rgb",
    "do_normalize",
    "do_rescale",
    "do_resize",
    "image_mean",
    "image_std",
    "merge_size",
    "patch_size",
    "resample",
    "rescale_factor",
    "size",
    "temporal_patch_size",
)


def write_video_config(image_processor: Any, folder: Path) -> None:
    """``video_preprocessor_config.json`` beside the processor: ``AutoProcessor`` (with
    torchvision) builds a Qwen2-VL folder's video processor from it and refuses a folder
    without it. The image processor's settings, as a Qwen2-VL checkpoint's video processor has
    them; this ``AutoProcessor`` then loads ``final/`` as a ``Qwen2VLProcessor`` (checked by
    hand with torchvision 0.21, which ortft does not install)."""
    import json

    settings = image_processor.to_dict()
    video = {k: settings[k] for k in VIDEO_KEYS if k in settings}
    video["video_processor_type"] = "Qwen2VLVideoProcessor"
    (folder / "video_preprocessor_config.json").write_text(json.dumps(video, indent=2) + "\n")


def is_folder(folder: str) -> bool:
    """Whether ``folder`` holds a Qwen2-VL processor (its recorded processor class)."""
    import json

    for name in ("processor_config.json", "preprocessor_config.json"):
        path = Path(folder) / name
        if not path.is_file():
            continue
        saved = json.loads(path.read_text())
        kind = str(saved.get("image_processor_type", ""))
        if saved.get("processor_class") == PROCESSOR_CLASS or kind.startswith("Qwen2VLImage"):
            return True
    return False


def from_folder(folder: str, field: str) -> Any:
    """The processor saved in ``folder``: its image processor (PIL), tokenizer and chat
    template, in ``processor_class()``."""
    import json

    from transformers import AutoTokenizer
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    try:
        images = Qwen2VLImageProcessorPil.from_pretrained(folder)
        tokenizer = AutoTokenizer.from_pretrained(folder)
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise InputError(
            f"{field}: {folder}: cannot load the processor ({first_line(err)})"
        ) from None
    template = getattr(tokenizer, "chat_template", None)
    jinja, legacy = Path(folder) / "chat_template.jinja", Path(folder) / "chat_template.json"
    if jinja.is_file():
        template = jinja.read_text()
    elif legacy.is_file():  # the Hub's Qwen2-VL folders
        template = json.loads(legacy.read_text()).get("chat_template", template)
    if template is None:
        raise InputError(f"{field}: {folder}: the Qwen2-VL processor has no chat template")
    return processor_class()(image_processor=images, tokenizer=tokenizer, chat_template=template)


def for_config(options: Any, tokenizer: Any) -> Any:
    """The processor of a from_config model: Qwen2-VL's PIL image processor resizing every
    square image to ``task.image_size`` (min = max pixels: one grid for the digits), patches of
    ``task.patch_size``; ``tokenizer`` with ChatML's and the vision tokens, ``<|im_end|>`` its
    end-of-sequence (the turn's end: generation stops there)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    side = options.image_size
    if side % (options.patch_size * MERGE):
        raise InputError(
            f"task.image_size={side}: Qwen2-VL needs a multiple of task.patch_size x 2 "
            f"(= {options.patch_size * MERGE}; 2 x 2 patches merge into one token)"
        )
    images = Qwen2VLImageProcessorPil(
        patch_size=options.patch_size,
        temporal_patch_size=TEMPORAL,
        merge_size=MERGE,
        size={"shortest_edge": side * side, "longest_edge": side * side},
    )
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIALS})
    tokenizer.eos_token = TURN_END
    if PAD in tokenizer.get_vocab():
        tokenizer.pad_token = PAD
    elif tokenizer.pad_token is None:
        tokenizer.pad_token = TURN_END
    return processor_class()(
        image_processor=images, tokenizer=tokenizer, chat_template=CHAT_TEMPLATE
    )


def model_config(spec: Any, options: Any, tokenizer: Any, dropout: float | None) -> Any:
    """The ``Qwen2VLConfig`` of a from_config model: Qwen2-VL's vision transformer from the
    task's ``vision_*`` options and ``patch_size``, a Qwen2 language model with
    ``model.from_config``'s sizes (``generic_config``'s path) and M-RoPE sections splitting each
    head's rotary half 1:1.5:1.5 over (time, height, width), as Qwen2-VL's 16:24:24 does."""
    from transformers import Qwen2VLConfig

    from ortft.backends.torch import hf_config

    text = hf_config.generic_config(
        spec.model_copy(update={"architecture": "qwen2"}), tokenizer, dropout
    )
    half = text.hidden_size // text.num_attention_heads // 2
    t = max(1, half // 4)
    h = (half - t) // 2
    rope = {
        "rope_type": "default",
        "rope_theta": float(getattr(text, "rope_theta", None) or 10000.0),
        "mrope_section": [t, h, half - t - h],
    }
    ids = tokenizer.convert_tokens_to_ids
    # Qwen2's own default is 7B's 32 key/value heads: without num_kv_heads, one per head
    heads = spec.num_kv_heads or text.num_attention_heads
    text_config = {**text.to_dict(), "rope_parameters": rope, "num_key_value_heads": heads}
    for key in ("model_type", "architectures", "transformers_version"):
        text_config.pop(key, None)
    return Qwen2VLConfig(
        vision_config={
            "depth": options.vision_layers,
            "embed_dim": options.vision_hidden_size,
            "hidden_size": text.hidden_size,  # the merger's output: the language model's width
            "num_heads": options.vision_heads,
            "mlp_ratio": 4,
            "patch_size": options.patch_size,
            "temporal_patch_size": TEMPORAL,
            "spatial_merge_size": MERGE,
        },
        text_config=text_config,
        image_token_id=ids(IMAGE_TOKEN),
        video_token_id=ids(VIDEO_TOKEN),
        vision_start_token_id=ids(VISION_START),
        vision_end_token_id=ids(VISION_END),
    )


def image_tokens(processor: Any, path: str) -> int:
    """The image tokens ``path``'s image expands into: its grid after the image processor's
    resize (``smart_resize`` on its size, read from the header), merged 2 x 2."""
    from PIL import Image
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    ip = processor.image_processor
    with Image.open(path) as im:
        width, height = im.size
    h, w = smart_resize(
        height,
        width,
        factor=ip.patch_size * ip.merge_size,
        min_pixels=ip.size["shortest_edge"],
        max_pixels=ip.size["longest_edge"],
    )
    return (h // ip.patch_size) * (w // ip.patch_size) // ip.merge_size**2


def pixels(images: list[Any], processor: Any) -> dict[str, np.ndarray]:
    """``pixel_values`` [images, most patches, C x T x P x P] (each row's patches, zero-padded
    to the batch's most) and ``image_grid_thw`` [images, 3]."""
    out = processor.image_processor(images=images, return_tensors="np")
    grid = np.asarray(out["image_grid_thw"], dtype=np.int64)
    flat = np.asarray(out["pixel_values"], dtype=np.float32)
    counts = grid.prod(axis=1)
    padded = np.zeros((len(grid), int(counts.max()), flat.shape[1]), np.float32)
    for row, (lo, n) in enumerate(zip(np.cumsum(counts) - counts, counts, strict=True)):
        padded[row, :n] = flat[lo : lo + n]
    return {"pixel_values": padded, "image_grid_thw": grid}


def unpadded(pixel_values: Any, grid: Any) -> Any:
    """The batch's patches as the vision transformer takes them, [patches, C x T x P x P]."""
    import torch

    counts = grid.prod(dim=-1)
    real = torch.arange(pixel_values.shape[1], device=grid.device)[None, :] < counts[:, None]
    return pixel_values[real]


def generate_inputs(model: Any, ids: Any, vision: dict[str, Any]) -> dict[str, Any]:
    """What transformers' ``generate`` and forward take besides the ids: the flat patches, the
    grid and the token types M-RoPE reads (1: an image token)."""
    import torch

    pixel_values = torch.as_tensor(vision["pixel_values"])
    grid = torch.as_tensor(vision["image_grid_thw"])
    return {
        "pixel_values": unpadded(pixel_values, grid),
        "image_grid_thw": grid,
        "mm_token_type_ids": (ids == int(model.config.image_token_id)).int(),
    }


def positions(model: Any, input_ids: Any, attention_mask: Any, grid: Any) -> Any:
    """M-RoPE's position ids of a batch, [batch, 3, sequence] (``get_rope_index``)."""
    types = (input_ids == int(model.config.image_token_id)).int()
    found, _ = model.model.get_rope_index(
        input_ids, mm_token_type_ids=types, image_grid_thw=grid, attention_mask=attention_mask
    )
    return found.permute(1, 0, 2).contiguous()


def merged(embeds: Any, features: Any, input_ids: Any, image_id: int) -> Any:
    """``embeds`` [B, L, H] with the image tokens' rows replaced by ``features`` [N, H] (the
    batch's images in order, row after row): a gather over the flat concatenation (ONNX
    ``Gather``, whose gradient ORT has)."""
    import torch

    b, length, h = embeds.shape
    is_image = input_ids == image_id
    per_row = is_image.long().sum(dim=1)
    offset = torch.cumsum(per_row, dim=0) - per_row  # each row's first feature
    nth = torch.cumsum(is_image.long(), dim=1) - 1 + offset[:, None]
    flat = torch.arange(b * length, device=input_ids.device).view(b, length)
    index = torch.where(is_image, b * length + nth, flat)
    both = torch.cat([embeds.reshape(b * length, h), features.to(embeds.dtype)], dim=0)
    return torch.index_select(both, 0, index.reshape(-1)).view(b, length, h)


def forward(
    model: Any,
    input_ids: Any,
    attention_mask: Any,
    labels: Any,
    rope_positions: Any,
    pixel_values: Any = None,
    image_grid_thw: Any = None,
    image_features: Any = None,
    label_index: Any = None,
) -> tuple[Any, Any]:
    """(loss, logits): the vision transformer's output (given, or computed here from the
    pixels), merged 2 x 2 by the merger, gathered into the token embeddings; the language model
    on the M-RoPE positions, its head at the answers' positions (``ortft.tasks.lm_head``)."""
    from ortft.families.vision_language.qwen2vl_graphs import VisionEncoder
    from ortft.tasks.lm_head import next_token_loss

    base = getattr(model, "get_base_model", None)  # peft's wrapper: LoRA sits in it in place
    m = base() if base is not None else model
    if image_features is None:  # the vision transformer trains: it runs inside the module
        if pixel_values is None or image_grid_thw is None:
            raise RuntimeError("image-text-to-text: a Qwen2-VL batch without its pixels")
        flat = unpadded(pixel_values, image_grid_thw)
        image_features = VisionEncoder(m).hidden(flat, image_grid_thw)
    projected = m.model.visual.merger(image_features)
    embeds = m.get_input_embeddings()(input_ids)
    inputs = merged(embeds, projected, input_ids, int(m.config.image_token_id))
    out = m.model(
        inputs_embeds=inputs,
        attention_mask=attention_mask,
        position_ids=rope_positions.permute(1, 0, 2),
        use_cache=False,
        return_dict=True,
    )
    return next_token_loss(m.lm_head, out.last_hidden_state, labels, label_index)


class Qwen2VL:
    """``archs.Arch`` for ``Qwen2VLForConditionalGeneration``: the grid's pixels and image
    tokens, the rope positions computed before the module, this module's ``forward``."""

    model_type = ARCHITECTURE
    language = "language_model"
    projector = "merger"  # the vision transformer's patch merger
    pixel_keys: tuple[str, ...] = ("pixel_values", "image_grid_thw")

    def vision_parameters(self, model: Any) -> list[Any]:
        """The vision transformer's parameters, not its merger's."""
        visual = model.model.visual
        return [p for n, p in visual.named_parameters() if not n.startswith("merger.")]

    def for_config(self, options: Any, tokenizer: Any) -> Any:
        return for_config(options, tokenizer)

    def ready(self, processor: Any) -> Any:
        return processor

    def model_config(self, spec: Any, options: Any, tokenizer: Any, dropout: float | None) -> Any:
        return model_config(spec, options, tokenizer, dropout)

    def vision_features(self, model: Any, pixels: dict[str, Any]) -> Any:
        """The vision transformer's blocks' output [patches, embed] (before the merger) of a
        frozen tower, before the module: transformers' own per-image attention. A tower that
        trains runs inside ``forward`` as ``qwen2vl_graphs.VisionEncoder`` (ORTModule traces
        it), one attention over the batch's patches with a block-diagonal mask."""
        from ortft.families.vision_language.model import llava

        grid = pixels["image_grid_thw"]
        flat = unpadded(pixels["pixel_values"], grid)
        return llava(model).model.visual(flat, grid_thw=grid).last_hidden_state

    def project(self, model: Any, features: Any) -> Any:
        return model.model.visual.merger(features)

    def pixels(self, processor: Any, decoded: list[Any]) -> dict[str, Any]:
        return pixels(decoded, processor)

    def expansion(self, processor: Any, path: str | None) -> list[int] | None:
        if path is None:
            raise RuntimeError("qwen2_vl: an image's tokens depend on its image's size")
        return [processor.image_token_id] * image_tokens(processor, path)

    def extra_inputs(self, model: Any, inputs: dict[str, Any]) -> dict[str, Any]:
        import torch

        with torch.no_grad():
            found = positions(
                model, inputs["input_ids"], inputs["attention_mask"], inputs["image_grid_thw"]
            )
        return {"rope_positions": found}

    def forward(
        self,
        model: Any,
        input_ids: Any,
        attention_mask: Any,
        labels: Any,
        inputs: dict[str, Any],
        image_features: Any,
    ) -> tuple[Any, Any]:
        return forward(
            model,
            input_ids,
            attention_mask,
            labels,
            inputs["rope_positions"],
            pixel_values=inputs.get("pixel_values"),
            image_grid_thw=inputs.get("image_grid_thw"),
            image_features=image_features,
            label_index=inputs.get("label_index"),
        )

    def model_inputs(self, model: Any, ids: Any, vision: dict[str, Any]) -> dict[str, Any]:
        return generate_inputs(model, ids, vision)

    def card(self) -> str:
        from ortft.families.vision_language.qwen2vl_graphs import CARD

        return CARD

    def onnx_feeds(self, vision: dict[str, Any]) -> dict[str, Any]:
        """The flat patches of the padded rows and the grid."""
        grid = np.asarray(vision["image_grid_thw"], dtype=np.int64)
        counts = grid.prod(axis=1)
        flat = [row[:n] for row, n in zip(vision["pixel_values"], counts, strict=True)]
        return {"pixel_values": np.concatenate(flat).astype(np.float32), "grid_thw": grid}

    def onnx_steps(self, sessions: Any, config: Any, feeds: dict[str, Any]) -> Any:
        from ortft.families.vision_language import qwen2vl_graphs

        return qwen2vl_graphs.Steps(sessions, config, **feeds)

    def onnx_positions(self, ids: Any, mask: Any, feeds: dict[str, Any], config: Any) -> Any:
        """M-RoPE's 3-D positions (``qwen2vl_graphs.rope_index``)."""
        from ortft.families.vision_language import qwen2vl_graphs

        return qwen2vl_graphs.rope_index(ids, mask, feeds["grid_thw"], config)[0]
