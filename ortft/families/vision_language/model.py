"""The LLaVA model's parts as training runs them (torch): the vision features, and the forward
that puts the projected features where the image tokens are and runs the language model.

transformers' own forward puts them there with ``masked_scatter``; here a gather does it
(``merged``): the text embeddings and the projected features side by side, and for each position
the index of its row in that concatenation. A ``GatherElements`` in ONNX, whose gradient ORT
has, so ORTModule trains the projector and the language model as one graph. The logits are the
same as transformers' forward gives on ``pixel_values`` (a test checks it).
"""

from __future__ import annotations

from typing import Any

import torch


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


def vision_parameters(model: Any) -> list[Any]:
    """What ``task.freeze_vision`` freezes: the vision tower (Qwen2-VL's without its merger,
    ``qwen2vl_model.vision_tower``)."""
    from ortft.families.vision_language import qwen2vl_graphs, qwen2vl_model

    if qwen2vl_graphs.handles(model):
        return qwen2vl_model.vision_tower(model)
    return list(model.model.vision_tower.parameters())


def model_inputs(model: Any, ids: torch.Tensor, vision: dict[str, Any]) -> dict[str, Any]:
    """What transformers' own forward and ``generate`` take besides the ids, from the collated
    image arrays (``processor.vision_inputs``)."""
    from ortft.families.vision_language import qwen2vl_model

    if "image_grid_thw" in vision:
        return qwen2vl_model.generate_inputs(model, ids, vision)
    return {"pixel_values": torch.as_tensor(vision["pixel_values"])}


def forward(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    labels: torch.Tensor,
    pixel_values: torch.Tensor | None,
    image_features: torch.Tensor | None,
    **qwen2vl: Any,
) -> tuple[Any, Any]:
    """(loss, logits): the features (given, or the vision tower's of ``pixel_values``)
    projected and gathered into the token embeddings, then the language model and its head.
    A Qwen2-VL batch (its grid and rope positions in ``qwen2vl``): ``qwen2vl_model.forward``."""
    if qwen2vl:
        from ortft.families.vision_language import qwen2vl_model

        return qwen2vl_model.forward(
            model,
            input_ids,
            attention_mask,
            labels,
            pixel_values=pixel_values,
            image_features=image_features,
            **qwen2vl,
        )
    m = llava(model)
    if image_features is None:  # the vision tower trains: it runs inside the module
        if pixel_values is None:
            raise RuntimeError("image-text-to-text: a batch without pixel_values")
        image_features = vision_features(m, pixel_values)
    projected = m.model.multi_modal_projector(image_features)
    embeds = m.get_input_embeddings()(input_ids)
    inputs = merged(embeds, projected, input_ids, int(m.config.image_token_id))
    out = m(
        inputs_embeds=inputs,
        attention_mask=attention_mask,
        labels=labels,
        use_cache=False,
        return_dict=True,
    )
    return out.loss, out.logits
