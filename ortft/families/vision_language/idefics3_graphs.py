"""Idefics3's (SmolVLM's architecture) vision graph, in the layout transformers.js's
``Idefics3ForConditionalGeneration`` opens; the embeddings and the decoder graph are the
shared ones (``vlm_graphs``).

- ``onnx/vision_encoder.onnx``: ``pixel_values`` [batch, images, 3, H, W] and
  ``pixel_attention_mask`` (bool) [batch, images, H, W] -> ``image_features``
  [real images, image_seq_len, hidden]. The processor splits an image into tiles of
  ``max_image_size`` (``rows`` x ``cols`` of them, and the whole image resized, last); a batch
  pads each row's tiles with all-zero images, which the graph drops as the model does. Each
  tile's patches go through the SigLIP-style encoder (positions by the patch mask), the
  connector's pixel shuffle (``scale_factor``^2 patches into one token) and its projection.

transformers.js flattens the features to [tokens, hidden] and scatters them at the image
tokens, as for LLaVA (``vlm_graphs.merge``); its ``Idefics3Processor`` expands each image token
from ``rows``/``cols`` and ``image_seq_len`` (``processor_config.json``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from ortft.core.errors import InputError
from ortft.families.vision_language import vlm_graphs as graphs


class VisionEncoder(torch.nn.Module):
    """(pixel_values, pixel_attention_mask) -> the connector's features of every real tile,
    as the model's ``get_image_features`` computes them; written out because that method
    returns a list per batch row (the tracer would fix the row count)."""

    def __init__(self, model: Any):
        super().__init__()
        inner = model.model
        self.vision, self.connector = inner.vision_model, inner.connector
        self.patch = int(model.config.vision_config.patch_size)

    def forward(self, pixel_values: torch.Tensor, pixel_attention_mask: torch.Tensor):
        _, _, channels, height, width = pixel_values.shape
        pixels = pixel_values.reshape(-1, channels, height, width)
        mask = pixel_attention_mask.reshape(-1, height, width).to(torch.int64)
        real = (pixels == 0.0).sum(dim=(-1, -2, -3)) != channels * height * width
        pixels, mask = pixels[real], mask[real]
        # a patch is real where any of its pixels is (the model's unfold, as a reshape)
        p = self.patch
        grid = mask.reshape(-1, height // p, p, width // p, p)
        patches = grid.sum(dim=(2, 4)) > 0
        return self.connector(self.encode(pixels, patches))

    def encode(self, pixels: torch.Tensor, patches: torch.Tensor) -> torch.Tensor:
        """The vision model's forward, its embeddings' positions computed as the graph can
        hold them (``positions``)."""
        from transformers.masking_utils import create_bidirectional_mask

        emb = self.vision.embeddings
        hidden = emb.patch_embedding(pixels).flatten(2).transpose(1, 2)
        hidden = hidden + emb.position_embedding(positions(patches, emb.num_patches_per_side))
        mask = create_bidirectional_mask(
            config=self.vision.config,
            inputs_embeds=hidden,
            attention_mask=patches.reshape(patches.shape[0], -1),
        )
        out = self.vision.encoder(inputs_embeds=hidden, attention_mask=mask)
        return self.vision.post_layernorm(out.last_hidden_state)


def positions(patches: torch.Tensor, side: int) -> torch.Tensor:
    """Each patch's position id, as ``Idefics3VisionEmbeddings`` gives it: the real patches'
    fractional coordinates bucketed onto the ``side`` x ``side`` grid, 0 where padded. Its
    ``bucketize`` and its float ``torch.full`` export as a float index the Gather refuses:
    the bucket here is the count of boundaries at or below the coordinate (``right=True``)."""
    boundaries = torch.arange(1 / side, 1.0, 1 / side)
    rows = patches[:, :, 0].sum(dim=1)
    cols = patches[:, 0, :].sum(dim=1)
    h = torch.arange(patches.shape[1], dtype=torch.float32)[None, :] * (1.0 / rows)[:, None]
    w = torch.arange(patches.shape[2], dtype=torch.float32)[None, :] * (1.0 / cols)[:, None]
    h, w = h.clamp(max=1.0 - 1e-6), w.clamp(max=1.0 - 1e-6)
    bucket_h = (h[..., None] >= boundaries).sum(-1)
    bucket_w = (w[..., None] >= boundaries).sum(-1)
    ids = (bucket_h[:, :, None] * side + bucket_w[:, None, :]).reshape(patches.shape[0], -1)
    return torch.where(patches.reshape(patches.shape[0], -1), ids, torch.zeros_like(ids))


class Idefics3Layout(graphs.SharedLayout):
    """``export.Layout`` for ``Idefics3ForConditionalGeneration`` (SmolVLM's architecture)."""

    def accepts(self, model: Any) -> bool:
        return getattr(model.config, "model_type", None) == "idefics3"

    def check(self, model: Any) -> None:
        inner = getattr(model, "model", None)
        if not hasattr(inner, "vision_model") or not hasattr(inner, "connector"):
            raise InputError(
                f"{type(model).__name__}: an idefics3 config without Idefics3's vision model "
                "and connector"
            )

    def vision_graph(self, model: Any, inputs: list[Any]) -> graphs.VisionGraph:
        """Traced on the first sample's tiles in a batch of 2 whose second row has one tile
        less (an all-zero padding image), so the padding's removal stays in the graph."""
        pixels, mask = inputs[0]["pixel_values"][:1], inputs[0]["pixel_attention_mask"][:1]
        short_pixels, short_mask = pixels.clone(), mask.clone()
        short_pixels[:, -1], short_mask[:, -1] = 0, 0
        example = (torch.cat([pixels, short_pixels]), torch.cat([mask, short_mask]).bool())
        axes = {
            "pixel_values": {0: "batch", 1: "images"},
            "pixel_attention_mask": {0: "batch", 1: "images"},
            "image_features": {0: "tiles"},
        }
        names = ["pixel_values", "pixel_attention_mask"]
        return graphs.VisionGraph(VisionEncoder(model).eval(), example, names, axes)

    def vision_feeds(self, x: Any) -> dict[str, np.ndarray]:
        return {
            "pixel_values": x["pixel_values"].numpy(),
            "pixel_attention_mask": x["pixel_attention_mask"].numpy().astype(bool),
        }

    def reference_features(self, model: Any, x: Any) -> torch.Tensor:
        out = model.model.get_image_features(
            pixel_values=x["pixel_values"],
            pixel_attention_mask=x["pixel_attention_mask"],
            return_dict=True,
        )
        return torch.cat(list(out.pooler_output))

    def save_processor(self, processor: Any, folder: Path) -> dict[str, Any]:
        graphs.write_processor(processor, folder, "Idefics3Processor")
        return {
            "file": "preprocessor_config.json",
            "class": type(processor.image_processor).__name__,
            "processor": type(processor).__name__,
            "image_tokens": "image_seq_len per tile, rows x cols tiles and the whole image "
            "(processor_config.json, preprocessor_config.json's max_image_size)",
        }


LAYOUT = Idefics3Layout()
