"""A Qwen2-VL model's part of the export (``LAYOUT``, an ``export.Layout``), in the layout
transformers.js's ``Qwen2VLForConditionalGeneration`` opens: its vision graph, its decoder
positions and its config.json; the embeddings, the decoder graph and the generation loop are
the shared ones (``vlm_graphs``).

- ``onnx/vision_encoder.onnx``: ``pixel_values`` [patches, channels x temporal x patch x patch]
  (the processor's flattened patches) and ``grid_thw`` [images, 3] (its ``image_grid_thw``) ->
  ``image_features`` [patches / merge^2, hidden]: the vision transformer and its patch merger.
- ``onnx/embed_tokens.onnx``: as for LLaVA (``vlm_graphs``).
- ``onnx/decoder_model_merged.onnx``: as for LLaVA, but ``position_ids`` is [3, batch,
  sequence]: the multimodal rotary positions (temporal, height, width) that ``rope_index``
  computes from the prompt and ``grid_thw``; each later token is at past length + the row's
  rope delta on all three rows (transformers.js's ``get_rope_index`` and
  ``prepare_inputs_for_generation``).

The vision encoder is written out here (``VisionEncoder``) because the model's forward takes
its rotary positions and its per-frame attention blocks from ``grid_thw.tolist()``, which the
tracer would fix at the example's grid; here both are tensor ops on ``grid_thw``, and the
per-frame blocks are one attention with a block-diagonal mask.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from ortft.core.errors import InputError
from ortft.families.vision_language import vlm_graphs


def handles(model: Any) -> bool:
    """Whether ``model`` is a Qwen2-VL (a patch-merging vision transformer under ``visual``)."""
    visual = getattr(getattr(model, "model", None), "visual", None)
    return all(hasattr(visual, n) for n in ("patch_embed", "blocks", "merger", "rotary_pos_emb"))


class VisionEncoder(torch.nn.Module):
    """(pixel_values, grid_thw) -> image_features, as the model's ``get_image_features``."""

    def __init__(self, model: Any):
        super().__init__()
        if not handles(model):
            raise InputError(f"{type(model).__name__}: not a Qwen2-VL model (no model.visual)")
        self.visual = model.model.visual
        self.merge = int(self.visual.spatial_merge_size)

    def forward(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        return self.visual.merger(self.hidden(pixel_values, grid_thw))

    def hidden(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        """The blocks' output, before the patch merger (what training feeds the merger)."""
        v = self.visual
        hidden = v.patch_embed(pixel_values)
        frame, positions = patch_layout(grid_thw, hidden.shape[0], self.merge)
        cos, sin = v.rotary_pos_emb(hidden, positions)
        # the model attends within each frame (its cu_seqlens): a block-diagonal mask
        same = frame[:, None] == frame[None, :]
        bias = torch.zeros(same.shape, dtype=hidden.dtype).masked_fill(
            ~same, torch.finfo(hidden.dtype).min
        )
        for block in v.blocks:
            hidden = hidden + _attention(block.attn, block.norm1(hidden), cos, sin, bias)
            hidden = hidden + block.mlp(block.norm2(hidden))
        return hidden


def patch_layout(grid_thw: torch.Tensor, n: int, merge: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For each of the ``n`` patches: the first patch of its frame (its attention block) and its
    (row, column) in the image, in the processor's order (merge x merge blocks, row-major),
    as ``transformers.vision_utils.get_vision_position_ids`` lays them out."""
    index = torch.arange(n, dtype=grid_thw.dtype)
    t, h, w = grid_thw[:, 0], grid_thw[:, 1], grid_thw[:, 2]
    sizes = t * h * w
    ends = torch.cumsum(sizes, 0)
    image = (index[:, None] >= ends[None, :]).sum(1)
    begin = (ends - sizes)[image]
    local, area = index - begin, (h * w)[image]
    frame = begin + (local // area) * area
    cell = local % area
    blocks_w = w[image] // merge
    row = (cell // (merge * merge * blocks_w)) * merge + (cell // merge) % merge
    col = ((cell // (merge * merge)) % blocks_w) * merge + cell % merge
    return frame, torch.stack([row, col], dim=-1)


def _attention(attn: Any, x: torch.Tensor, cos, sin, bias: torch.Tensor) -> torch.Tensor:
    from transformers.models.qwen2_vl.modeling_qwen2_vl import apply_rotary_pos_emb_vision

    n = x.shape[0]
    q, k, v = attn.qkv(x).reshape(n, 3, attn.num_heads, -1).permute(1, 0, 2, 3).unbind(0)
    q, k = apply_rotary_pos_emb_vision(q, k, cos, sin)
    q, k, v = (t.transpose(0, 1) for t in (q, k, v))  # [heads, patches, head_dim]
    weights = torch.softmax(q @ k.transpose(1, 2) * attn.scaling + bias, dim=-1)
    return attn.proj((weights @ v).transpose(0, 1).reshape(n, -1))


# transformers.js 4.3.1 reads a qwen2_vl config's cache sizes at its top level (it looks into
# ``text_config`` only for qwen2_5_vl and later), where transformers 5 writes them nested
TOP_LEVEL_TEXT_KEYS = (
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "hidden_size",
    "vocab_size",
)


def save_config(model: Any, folder: Path) -> None:
    """config.json and generation_config.json, with the text model's sizes also at the top
    level of config.json (``TOP_LEVEL_TEXT_KEYS``; transformers reads them either way)."""
    import json

    from ortft.export import generation

    generation.save(model, folder)
    path = folder / "config.json"
    config = json.loads(path.read_text())
    text = config.get("text_config") or {}
    config.update({k: text[k] for k in TOP_LEVEL_TEXT_KEYS if k in text and k not in config})
    path.write_text(json.dumps(config, indent=2) + "\n")


def rope_index(
    ids: np.ndarray, mask: np.ndarray, grid_thw: np.ndarray, config: Any
) -> tuple[np.ndarray, np.ndarray]:
    """(position_ids [3, batch, sequence], rope deltas [batch, 1]) of a prompt batch, as
    transformers.js's ``get_rope_index`` gives them: text at consecutive positions on all three
    rows; an image (after ``vision_start_token_id``) on its (t, h, w) grid of merged patches from
    the next free position; the text after it from that position + max(t, h, w). A padded
    position gets 0; the delta is the row's last position + 1 - the padded length."""
    merge = int(config.vision_config.spatial_merge_size)
    image, start = int(config.image_token_id), int(config.vision_start_token_id)
    positions = np.zeros((3, *ids.shape), np.int64)
    deltas = np.zeros((len(ids), 1), np.int64)
    grids = iter(np.asarray(grid_thw).tolist())
    for row in range(len(ids)):
        keep = mask[row] == 1
        tokens = ids[row][keep]
        parts, done, nxt = [], 0, 0
        for at in np.flatnonzero(tokens[:-1] == start).tolist():
            if tokens[at + 1] != image:
                continue
            t, h, w = next(grids)
            text = at + 1 - done
            parts.append(np.broadcast_to(nxt + np.arange(text), (3, text)))
            nxt += text
            axes = (np.arange(t), np.arange(h // merge), np.arange(w // merge))
            parts.append(nxt + np.stack([g.ravel() for g in np.meshgrid(*axes, indexing="ij")]))
            nxt += max(t, h // merge, w // merge)
            done = at + 1 + t * (h // merge) * (w // merge)
        rest = len(tokens) - done
        parts.append(np.broadcast_to(nxt + np.arange(rest), (3, rest)))
        flat = np.concatenate(parts, axis=1)
        positions[:, row, keep] = flat
        deltas[row, 0] = flat.max() + 1 - ids.shape[1]
    return positions, deltas


class Steps(vlm_graphs.Steps):
    """The shared loop (``vlm_graphs.Steps``) on Qwen2-VL's positions: the prompt's rope
    positions, then each later token at past length + the row's rope delta on all three
    rows."""

    def __init__(self, sessions: vlm_graphs.Sessions, config: Any, **feeds: np.ndarray):
        super().__init__(sessions, **feeds)
        self.grid, self.config = feeds["grid_thw"], config
        self.deltas = np.zeros((0, 1), np.int64)

    def positions(self, tokens: np.ndarray, prompt: bool) -> np.ndarray:
        if prompt:
            positions, self.deltas = rope_index(tokens, self.mask, self.grid, self.config)
            return positions
        past = self.mask.shape[1] - tokens.shape[1]
        row = past + self.deltas + np.arange(tokens.shape[1])
        return np.broadcast_to(row, (3, *tokens.shape)).copy()

    def reorder(self, rows: np.ndarray) -> None:
        super().reorder(rows)
        self.deltas = self.deltas[rows]


class Qwen2VLLayout(vlm_graphs.SharedLayout):
    """``export.Layout`` for ``Qwen2VLForConditionalGeneration``."""

    position_rows = 3  # position_ids [3, batch, sequence]

    def accepts(self, model: Any) -> bool:
        return handles(model)

    def check(self, model: Any) -> None:
        VisionEncoder(model)

    def vision_graph(self, model: Any, inputs: list[Any]) -> vlm_graphs.VisionGraph:
        """Traced on two images of different grids, so the graph keeps the grid's
        arithmetic."""
        pixels = torch.cat([x["pixel_values"] for x in inputs[:2]])
        grid = torch.cat([x["image_grid_thw"] for x in inputs[:2]])
        axes = {
            "pixel_values": {0: "patches"},
            "grid_thw": {0: "images"},
            "image_features": {0: "image_tokens"},
        }
        names = ["pixel_values", "grid_thw"]
        return vlm_graphs.VisionGraph(VisionEncoder(model).eval(), (pixels, grid), names, axes)

    def vision_feeds(self, x: Any) -> dict[str, np.ndarray]:
        return {
            "pixel_values": x["pixel_values"].numpy().astype(np.float32),
            "grid_thw": x["image_grid_thw"].numpy().astype(np.int64),
        }

    def reference_features(self, model: Any, x: Any) -> torch.Tensor:
        """The model's own image features (what its forward scatters), [tokens, hidden]."""
        out = model.model.get_image_features(
            x["pixel_values"], x["image_grid_thw"], return_dict=True
        )
        return torch.cat(list(out.pooler_output))

    def image_count(self, x: Any) -> int:
        return len(x["image_grid_thw"])

    def save_config(self, model: Any, folder: Path) -> None:
        save_config(model, folder)

    def save_processor(self, processor: Any, folder: Path) -> dict[str, Any]:
        vlm_graphs.write_processor(processor, folder, "Qwen2VLProcessor")
        return {
            "file": "preprocessor_config.json",
            "class": type(processor.image_processor).__name__,
            "processor": type(processor).__name__,
            "image_tokens": "grid_t x grid_h x grid_w / merge_size^2 (preprocessor_config.json)",
        }

    def prompt_positions(self, model: Any, x: Any, mask: np.ndarray) -> np.ndarray:
        grid = x["image_grid_thw"].numpy()
        return rope_index(x["input_ids"].numpy(), mask, grid, model.config)[0]

    def steps(self, sessions: vlm_graphs.Sessions, model: Any, x: Any) -> Steps:
        return Steps(sessions, model.config, **self.vision_feeds(x))


LAYOUT = Qwen2VLLayout()


# The model card's snippet of a Qwen2-VL export (``exporting.card``): the image processor and the
# tokenizer from the folder (transformers' AutoProcessor needs torchvision for Qwen2-VL), the
# image pad expanded by the grid, and the 3-D positions as ``rope_index`` gives them for one
# image: the text before it on one position for all three axes, the image on its (t, h, w)
# grid, the text after from the largest + 1; each new token at the past length + the delta.
CARD = """import json
import numpy as np
import onnxruntime as ort
from PIL import Image
from transformers import AutoTokenizer
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

tokenizer = AutoTokenizer.from_pretrained(".")
image_processor = Qwen2VLImageProcessorPil.from_pretrained(".")
merge = json.load(open("config.json"))["vision_config"]["spatial_merge_size"]
vision, embed, decoder = (
    ort.InferenceSession(f"onnx/{{n}}.onnx")
    for n in ("vision_encoder", "embed_tokens", "decoder_model_merged")
)
x = image_processor(images=[Image.open("image.png").convert("RGB")], return_tensors="np")
t, h, w = (int(v) for v in x["image_grid_thw"][0])
n = t * (h // merge) * (w // merge)  # image tokens
prompt = "<|im_start|>user\\n<|vision_start|>" + "<|image_pad|>" * n
prompt += "<|vision_end|>{question}<|im_end|>\\n<|im_start|>assistant\\n"
ids = np.array([tokenizer(prompt)["input_ids"]], dtype=np.int64)
emb = embed.run(None, {{"input_ids": ids}})[0]
features = vision.run(None, {{"pixel_values": x["pixel_values"].astype(np.float32),
                             "grid_thw": x["image_grid_thw"].astype(np.int64)}})[0]
at = int(np.flatnonzero(ids[0] == tokenizer.convert_tokens_to_ids("<|image_pad|>"))[0])
emb[0, at : at + n] = features
grid = np.meshgrid(np.arange(t), np.arange(h // merge), np.arange(w // merge), indexing="ij")
after = ids.shape[1] - at - n
pos = np.concatenate([np.tile(np.arange(at), (3, 1)), at + np.stack([g.ravel() for g in grid]),
                      np.tile(at + max(t, h // merge, w // merge) + np.arange(after), (3, 1))], 1)
delta = int(pos.max()) + 1 - ids.shape[1]
pos = pos[:, None, :]
past = {{
    i.name: np.zeros((1, i.shape[1], 0, i.shape[3]), np.float32)
    for i in decoder.get_inputs() if i.name.startswith("past_key_values")
}}
answer, mask = [], np.ones((1, 0), np.int64)
for _ in range(16):  # greedy
    mask = np.ones((1, mask.shape[1] + emb.shape[1]), np.int64)
    out = decoder.run(None, {{"inputs_embeds": emb, "attention_mask": mask, "position_ids": pos, **past}})
    past = dict(zip(past, out[1:]))
    token = int(out[0][0, -1].argmax())
    if token == tokenizer.eos_token_id:
        break
    answer.append(token)
    emb = embed.run(None, {{"input_ids": np.array([[token]])}})[0]
    pos = np.full((3, 1, 1), mask.shape[1] + delta, np.int64)
print(tokenizer.decode(answer, skip_special_tokens=True))
"""
