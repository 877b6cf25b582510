"""The model's parts as training runs them (torch): LLaVA's vision features, and the forward
that puts the projected features where the image tokens are and runs the language model (an
architecture's tower and projector: ``archs``).

transformers' own forward puts them there with ``masked_scatter``; here a gather does it
(``merged``): the text embeddings and the projected features side by side, and for each position
the index of its row in that concatenation. A ``GatherElements`` in ONNX, whose gradient ORT
has, so ORTModule trains the projector and the language model as one graph. The logits are the
same as transformers' forward gives on ``pixel_values`` (a test checks it).

The language model's head runs only where the loss reads it (``ortft.tasks.lm_head``): at the
positions whose next token is an answer's. transformers' forward projects every position onto
the vocabulary, the image tokens and the question's too, and its loss then ignores all but the
answers'. The loss is the same; the logits returned are those positions' rows, [answer tokens,
vocabulary], which is all the family reads of them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ortft.tasks.lm_head import next_token_loss


def llava(model: Any) -> Any:
    """The transformers model inside a peft wrapper (LoRA layers sit in it in place)."""
    base = getattr(model, "get_base_model", None)
    return base() if base is not None else model


def vision_features(model: Any, pixel_values: torch.Tensor) -> torch.Tensor:
    """The vision tower's features the projector takes (``get_image_features`` without the
    projector): the configured layer's hidden states, the CLS position dropped by the
    ``default`` strategy."""
    m = llava(model)
    cfg = m.config
    out = m.model.vision_tower(pixel_values, output_hidden_states=True, return_dict=True)
    layers = cfg.vision_feature_layer
    chosen = [layers] if isinstance(layers, int) else list(layers)
    states = [out.hidden_states[k] for k in chosen]
    if cfg.vision_feature_select_strategy == "default":
        states = [h[:, 1:] for h in states]
    return torch.cat(states, dim=-1)


def merged(
    embeds: torch.Tensor, features: torch.Tensor, input_ids: torch.Tensor, image_id: int
) -> torch.Tensor:
    """``embeds`` [B, L, H] with the image tokens' rows replaced, in order, by ``features``
    [B, N, H] (each row has N image tokens: encode checks it)."""
    length = embeds.shape[1]
    is_image = input_ids == image_id
    nth = torch.cumsum(is_image.long(), dim=1) - 1  # the j-th image token takes feature j
    positions = torch.arange(length, device=input_ids.device).expand_as(input_ids)
    index = torch.where(is_image, length + nth, positions)
    both = torch.cat([embeds, features.to(embeds.dtype)], dim=1)
    return torch.gather(both, 1, index.unsqueeze(-1).expand(-1, -1, embeds.shape[-1]))


def pixel_inputs(decoded: list[Any], image_processor: Any) -> dict[str, np.ndarray]:
    """The image processor's ``pixel_values`` (float32) of RGB Pillow images, and its
    ``pixel_attention_mask`` where it gives one (Idefics3's: [batch, tiles, H, W]). Each
    image is its own row's list (Idefics3's processor reads a flat list as one row's images)."""
    out = image_processor(images=[[image] for image in decoded], return_tensors="np")
    pixels = {"pixel_values": np.ascontiguousarray(out["pixel_values"], dtype=np.float32)}
    if out.get("pixel_attention_mask") is not None:
        pixels["pixel_attention_mask"] = np.asarray(out["pixel_attention_mask"], dtype=np.int64)
    return pixels


def as_tensors(vision: dict[str, Any]) -> dict[str, torch.Tensor]:
    """A batch's image arrays as transformers' own forward and ``generate`` take them."""
    return {k: torch.as_tensor(v) for k, v in vision.items()}


def forward(
    arch: Any,
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    labels: torch.Tensor,
    pixels: dict[str, torch.Tensor],
    image_features: torch.Tensor | None,
) -> tuple[Any, Any]:
    """(loss, logits): the features (given, or the vision tower's of ``pixels``: the collated
    ``pixel_values`` and the architecture's other pixel inputs) projected and gathered into
    the token embeddings, then the language model and its head at the answers' positions
    (``next_token_loss``; ``pixels["label_index"]`` where they were found before the module).
    ``arch``: the model's ``archs.Arch`` (its vision tower and projector)."""
    m = llava(model)
    if image_features is None:  # the vision tower trains: it runs inside the module
        if "pixel_values" not in pixels:
            raise RuntimeError("image-text-to-text: a batch without pixel_values")
        image_features = arch.vision_features(m, pixels)
    projected = arch.project(m, image_features)
    embeds = m.get_input_embeddings()(input_ids)
    inputs = merged(embeds, projected, input_ids, int(m.config.image_token_id))
    out = m.model(
        inputs_embeds=inputs, attention_mask=attention_mask, use_cache=False, return_dict=True
    )
    index = pixels.get("label_index")
    return next_token_loss(m.lm_head, out.last_hidden_state, labels, index)


class Common:
    """The ``archs.Arch`` parts LLaVA and Idefics3 share: the image processor's arrays, one
    expansion for every image, nothing computed before the module but the frozen tower's
    features, this module's ``forward``."""

    def pixels(self, processor: Any, decoded: list[Any]) -> dict[str, Any]:
        return pixel_inputs(decoded, processor.image_processor)

    def expansion(self, processor: Any, path: str | None) -> list[int] | None:
        return None

    def extra_inputs(self, model: Any, inputs: dict[str, Any]) -> dict[str, Any]:
        return {}

    def forward(
        self,
        model: Any,
        input_ids: Any,
        attention_mask: Any,
        labels: Any,
        inputs: dict[str, Any],
        image_features: Any,
    ) -> tuple[Any, Any]:
        return forward(self, model, input_ids, attention_mask, labels, inputs, image_features)

    def model_inputs(self, model: Any, ids: Any, vision: dict[str, Any]) -> dict[str, Any]:
        return as_tensors(vision)

    def card(self) -> str:
        from ortft.families.vision_language.vlm_graphs import CARD

        return CARD

    def onnx_feeds(self, vision: dict[str, Any]) -> dict[str, Any]:
        """``pixel_values`` as float32; Idefics3's ``pixel_attention_mask`` is a bool input
        there (``idefics3_graphs``)."""
        import numpy as np

        feeds = {"pixel_values": np.asarray(vision["pixel_values"], dtype=np.float32)}
        if "pixel_attention_mask" in vision:
            feeds["pixel_attention_mask"] = np.asarray(vision["pixel_attention_mask"], dtype=bool)
        return feeds

    def onnx_steps(self, sessions: Any, config: Any, feeds: dict[str, Any]) -> Any:
        from ortft.families.vision_language import vlm_graphs

        return vlm_graphs.Steps(sessions, **feeds)

    def onnx_positions(self, ids: Any, mask: Any, feeds: dict[str, Any], config: Any) -> Any:
        from ortft.families.vision_language import vlm_graphs

        return vlm_graphs.positions_of(mask, mask.shape[1])
