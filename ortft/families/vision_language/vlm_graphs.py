"""A LLaVA-style model's three ONNX graphs, in the layout transformers.js's
``LlavaForConditionalGeneration`` opens (its ``vision_encoder``, ``embed_tokens`` and
``decoder_model_merged`` sessions), and the numpy loop that generates from them. Another family
traces its own vision encoder (``VisionGraph``: Idefics3's in ``idefics3_graphs``, Qwen2-VL's
in ``qwen2vl_graphs``) and shares the rest (``SharedLayout``; Qwen2-VL its own positions).

- ``onnx/vision_encoder.onnx``: ``pixel_values`` [images, 3, height, width] ->
  ``image_features`` [images, image_tokens, hidden]: the vision tower's chosen layer
  (``vision_feature_layer``), less the CLS position under the ``default`` strategy, through the
  projector; what the model scatters into the text at its image tokens.
- ``onnx/embed_tokens.onnx``: ``input_ids`` [batch, sequence] -> ``inputs_embeds``.
- ``onnx/decoder_model_merged.onnx``: ``inputs_embeds`` [batch, sequence, hidden],
  ``attention_mask`` [batch, past + sequence], ``position_ids`` [batch, sequence] and
  ``past_key_values.<layer>.key|value`` [batch, heads, past, head_dim] -> ``logits`` and
  ``present.<layer>.key|value``. One graph serves the prompt (empty past) and every later
  token. transformers.js feeds ``position_ids`` where the session takes them (the mask's
  cumulative sum), so left-padded batches get the positions PyTorch gives them.

The client merges: it embeds the prompt, overwrites the rows at ``image_token_id`` with the
image features in order, and runs the decoder (``merge``). The flat-tensor wrapper carries the
cache, as the causal decoders' does (``ortft.families.generation.decoder_graph``: TorchScript
takes no ``Cache`` object).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ortft.core.errors import InputError
from ortft.export import decoder
from ortft.export import onnx_tools as tools

VISION, EMBED, DECODER = (
    "onnx/vision_encoder.onnx",
    "onnx/embed_tokens.onnx",
    "onnx/decoder_model_merged.onnx",
)
# raw uint8 [height, width, 3] RGB -> the vision encoder's pixel_values, where the image
# processor allows it (``export._Build.preprocess``); transformers.js preprocesses itself
PREPROCESS = "onnx/preprocess.onnx"


class VisionEncoder(torch.nn.Module):
    """pixel_values -> the projected image features [images, tokens, hidden], as the model's
    ``get_image_features`` computes them for one feature layer. Written out here because that
    method returns a list per image, which the tracer would fix at the example's image count."""

    def __init__(self, model: Any):
        super().__init__()
        inner: Any = getattr(model, "model", None)
        if not hasattr(inner, "vision_tower") or not hasattr(inner, "multi_modal_projector"):
            raise InputError(
                f"{type(model).__name__}: the image-text-to-text export writes LLaVA-style "
                "models (a vision tower, a projector and a language model), Idefics3 and "
                "Qwen2-VL"
            )
        self.tower, self.projector = inner.vision_tower, inner.multi_modal_projector
        self.layer = model.config.vision_feature_layer
        self.drop_cls = model.config.vision_feature_select_strategy == "default"
        if not isinstance(self.layer, int):
            layers = ", ".join(str(i) for i in self.layer)
            raise InputError(
                f"vision_feature_layer [{layers}]: the export takes one feature layer "
                "(LLaVA-1.5 and llava-hf's models use one)"
            )

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        out = self.tower(pixel_values, output_hidden_states=True, return_dict=True)
        features = out.hidden_states[self.layer]
        if self.drop_cls:  # the "default" strategy: every patch, not the CLS position
            features = features[:, 1:]
        return self.projector(features)


@dataclass(frozen=True)
class VisionGraph:
    """The vision encoder as a family traces it: the module, an example of its inputs, their
    names (the graph's inputs, in that order) and the dynamic axes of its inputs and of
    ``image_features``."""

    module: torch.nn.Module
    example: tuple[torch.Tensor, ...]
    inputs: list[str]
    axes: dict[str, dict[int, str]]


def llava_vision(model: Any, pixel_values: np.ndarray) -> VisionGraph:
    """LLaVA's vision graph: ``pixel_values`` [images, 3, H, W] alone."""
    return VisionGraph(
        VisionEncoder(model).eval(),
        (torch.from_numpy(pixel_values[:2]),),
        ["pixel_values"],
        {"pixel_values": {0: "batch"}, "image_features": {0: "batch"}},
    )


def write_processor(processor: Any, folder: Path, processor_class: str) -> None:
    """The processor as transformers and transformers.js both read it: transformers.js picks
    the processor class from ``preprocessor_config.json``'s ``processor_class`` (without it, a
    bare image processor that tokenizes nothing), so the image processor is saved there with
    it."""
    import json

    processor.save_pretrained(folder)  # processor_config.json, the tokenizer, chat template
    processor.image_processor.save_pretrained(folder)
    pre = folder / "preprocessor_config.json"
    pre.write_text(json.dumps({**json.loads(pre.read_text()), "processor_class": processor_class}))


def reference_features(model: Any, pixel_values: torch.Tensor) -> torch.Tensor:
    """The model's own image features (what its forward scatters), [images, tokens, hidden]."""
    c = model.config
    out = model.model.get_image_features(
        pixel_values=pixel_values,
        vision_feature_layer=c.vision_feature_layer,
        vision_feature_select_strategy=c.vision_feature_select_strategy,
        return_dict=True,
    )
    return torch.stack(list(out.pooler_output))


class EmbedTokens(torch.nn.Module):
    def __init__(self, model: Any):
        super().__init__()
        self.embed = model.get_input_embeddings()

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed(input_ids)


class Decoder(torch.nn.Module):
    """(inputs_embeds, attention_mask, position_ids, *flat past) -> (logits, *flat present)."""

    def __init__(self, model: Any, n_layers: int):
        super().__init__()
        self.model, self.n_layers = model, n_layers

    def forward(self, inputs_embeds, attention_mask, position_ids, *past):
        from transformers import DynamicCache

        cache = DynamicCache([(past[2 * i], past[2 * i + 1]) for i in range(self.n_layers)])
        out = self.model(
            inputs_embeds=inputs_embeds,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            use_cache=True,
            return_dict=True,
        )
        flat = [t for layer in out.cache.layers for t in (layer.keys, layer.values)]
        return (out.logits, *flat)


def cache_shape(model: Any) -> tuple[int, int, int]:
    """(layers, key/value heads, head dim), read from one real step of the language model."""
    with torch.no_grad():
        out = model(input_ids=torch.zeros((1, 2), dtype=torch.long), use_cache=True)
    layers = out.cache.layers
    _, heads, _, dim = layers[0].keys.shape
    return len(layers), int(heads), int(dim)


def export_graphs(
    model: Any, vision: VisionGraph, folder: Path, opset: int, position_rows: int = 0
) -> dict:
    """Write the three graphs under ``folder`` (``vision``: the family's vision encoder;
    ``position_rows``: ``export_text_graphs``'s); returns {graph: (inputs, outputs)} and the
    export's seconds under ``"export_s"``."""
    (folder / "onnx").mkdir(parents=True, exist_ok=True)
    seconds = tools.torch_export(
        vision.module,
        vision.example,
        folder / VISION,
        opset,
        vision.inputs,
        ["image_features"],
        vision.axes,
    )
    return {
        "vision_encoder": (vision.inputs, ["image_features"]),
        **export_text_graphs(model, folder, opset, position_rows=position_rows, seconds=seconds),
    }


def export_text_graphs(
    model: Any, folder: Path, opset: int, *, position_rows: int = 0, seconds: float = 0.0
) -> dict:
    """Write ``embed_tokens`` and the decoder under ``folder``; returns {graph: (inputs,
    outputs)} and ``seconds`` + the export's under ``"export_s"``. ``position_rows``: 0 for
    ``position_ids`` [batch, sequence], else its leading axis (3 for Qwen2-VL's multimodal
    rotary positions: [3, batch, sequence])."""
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    seconds += tools.torch_export(
        EmbedTokens(model).eval(),
        (ids,),
        folder / EMBED,
        opset,
        ["input_ids"],
        ["inputs_embeds"],
        {n: {0: "batch", 1: "sequence"} for n in ("input_ids", "inputs_embeds")},
    )
    layers, heads, dim = cache_shape(model)
    inputs = ["inputs_embeds", "attention_mask", "position_ids", *decoder.past_names(layers)]
    outputs = ["logits", *decoder.past_names(layers, "present")]
    shift = 1 if position_rows else 0
    axes = {
        "inputs_embeds": {0: "batch", 1: "sequence"},
        "attention_mask": {0: "batch", 1: "total_sequence"},
        "position_ids": {shift: "batch", shift + 1: "sequence"},
        "logits": {0: "batch", 1: "sequence"},
        **{n: {0: "batch", 2: "past_sequence"} for n in inputs[3:]},
        **{n: {0: "batch", 2: "total_sequence"} for n in outputs[1:]},
    }
    example = _decoder_example(model, layers, heads, dim, position_rows)
    with eager_text(model):
        seconds += tools.torch_export(
            Decoder(model, layers).eval(), example, folder / DECODER, opset, inputs, outputs, axes
        )
    return {
        "embed_tokens": (["input_ids"], ["inputs_embeds"]),
        "decoder": (inputs, outputs),
        "export_s": seconds,
    }


@contextlib.contextmanager
def eager_text(model: Any) -> Iterator[None]:
    """The language model on eager attention while it is traced, then back. The traced SDPA
    path gives NaN for a query that may attend to nothing (a left-padded prompt's padding, at
    the first step), and the NaN then reaches every position of its row through the next
    layer's keys; eager attention's additive mask (the dtype's minimum, not -inf) keeps them
    finite, as PyTorch's own SDPA does."""
    before = model.config.get_text_config()._attn_implementation
    model.set_attn_implementation({"text_config": "eager"})
    try:
        yield
    finally:
        model.set_attn_implementation({"text_config": before})


def _decoder_example(
    model: Any, layers: int, heads: int, dim: int, position_rows: int = 0
) -> tuple[torch.Tensor, ...]:
    """Two rows of 3 new positions after a past of 3; the second row's first 2 positions padded
    (so the mask stays in the graph), with the positions transformers.js gives them (on each of
    ``position_rows`` rows where the model takes several)."""
    gen = torch.Generator().manual_seed(0)
    hidden = int(model.get_input_embeddings().weight.shape[1])
    embeds = torch.randn(2, 3, hidden, generator=gen)
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[1, :2] = 0
    positions = positions_of(mask.numpy(), 3)
    if position_rows:
        positions = np.ascontiguousarray(np.broadcast_to(positions, (position_rows, 2, 3)))
    past = [torch.randn(2, heads, 3, dim, generator=gen) for _ in range(2 * layers)]
    return (embeds, mask, torch.from_numpy(positions), *past)


def positions_of(mask: np.ndarray, new: int) -> np.ndarray:
    """The last ``new`` position ids of ``mask`` as transformers' ``generate`` and
    transformers.js build them: the mask's cumulative sum - 1, padding at 1."""
    pos = np.cumsum(mask, axis=1) - 1
    pos[mask == 0] = 1
    return pos[:, -new:].astype(np.int64)


# --------------------------------------------------------------------------- running them


def merge(
    embeds: np.ndarray, input_ids: np.ndarray, features: np.ndarray, image_token: int
) -> np.ndarray:
    """``embeds`` with the rows at ``image_token`` overwritten by the image features, in order
    (the model's ``masked_scatter``; transformers.js's ``default_merge_input_ids_with_features``).
    A count that differs is an error, as on both sides."""
    flat = features.reshape(-1, features.shape[-1])
    where = input_ids == image_token
    if int(where.sum()) != len(flat):
        raise ValueError(
            f"{int(where.sum())} image tokens in the prompt but {len(flat)} image features"
        )
    out = embeds.copy()
    out[where] = flat
    return out


class Sessions:
    """The three graphs in onnxruntime."""

    def __init__(self, folder: Path, image_token: int):
        from ortft.export import parity

        self.vision = parity.session(folder / VISION)
        self.embed = parity.session(folder / EMBED)
        self.decoder = parity.session(folder / DECODER)
        self.image_token = image_token

    def image_features(self, pixel_values: np.ndarray, **extra: np.ndarray) -> np.ndarray:
        """``extra``: a family's other vision inputs (Idefics3's ``pixel_attention_mask``)."""
        feeds = {"pixel_values": pixel_values.astype(np.float32), **extra}
        return self.vision.run(None, feeds)[0]

    def embeds(self, input_ids: np.ndarray) -> np.ndarray:
        return self.embed.run(None, {"input_ids": input_ids.astype(np.int64)})[0]


class Steps:
    """``ortft.export.generation.Steps`` over the three graphs: the first call embeds the
    prompt, merges the image features in and runs the decoder with an empty past; each later
    call embeds one token and runs it against the cache. ``positions``: the decoder's
    ``position_ids`` (a family with other positions overrides it: Qwen2-VL's)."""

    def __init__(self, sessions: Sessions, pixel_values: np.ndarray, **extra: np.ndarray):
        self.s, self.pixel_values, self.extra = sessions, pixel_values, extra
        self.past: dict[str, np.ndarray] | None = None
        self.mask = np.zeros((0, 0), np.int64)

    def __call__(self, tokens: np.ndarray) -> np.ndarray:
        from ortft.export import parity

        embeds = self.s.embeds(tokens)
        prompt = self.past is None
        if self.past is None:  # the prompt: its image tokens become the image's features
            features = self.s.image_features(self.pixel_values, **self.extra)
            embeds = merge(embeds, tokens, features, self.s.image_token)
            self.past = parity.empty_past(self.s.decoder, len(tokens))
            self.mask = np.ones((len(tokens), 0), np.int64)
        self.mask = np.concatenate([self.mask, np.ones(tokens.shape, np.int64)], axis=1)
        feeds = {
            "inputs_embeds": embeds,
            "attention_mask": self.mask,
            "position_ids": self.positions(tokens, prompt),
            **self.past,
        }
        out = self.s.decoder.run(None, feeds)
        self.past = dict(zip(self.past, out[1:], strict=True))
        return out[0][:, -1]

    def positions(self, tokens: np.ndarray, prompt: bool) -> np.ndarray:
        """``tokens``' position ids (``self.mask`` already covers them; ``prompt``: the first
        call)."""
        return positions_of(self.mask, tokens.shape[1])

    def reorder(self, rows: np.ndarray) -> None:
        self.past = {k: v[rows] for k, v in (self.past or {}).items()}
        self.mask = self.mask[rows]


class SharedLayout:
    """The parts of ``export.Layout`` that LLaVA and Idefics3 share and Qwen2-VL overrides: the
    decoder's ``position_ids`` [batch, sequence] from the mask, config.json as transformers
    writes it, one image per ``pixel_values`` row. A family defines ``vision_feeds`` and the
    rest of the protocol."""

    position_rows = 0

    def vision_feeds(self, x: Any) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def image_count(self, x: Any) -> int:
        return len(x["pixel_values"])

    def save_config(self, model: Any, folder: Path) -> None:
        from ortft.export import generation

        generation.save(model, folder)  # config.json, generation_config.json

    def prompt_positions(self, model: Any, x: Any, mask: np.ndarray) -> np.ndarray:
        return positions_of(mask, mask.shape[1])

    def steps(self, sessions: Sessions, model: Any, x: Any) -> Steps:
        return Steps(sessions, **self.vision_feeds(x))


# The model card's snippet of an export with 2-D positions (LLaVA, Idefics3: ``exporting.card``)
CARD = """import numpy as np
import onnxruntime as ort
from PIL import Image
from transformers import AutoProcessor  # the image processor, the chat template

processor = AutoProcessor.from_pretrained(".")
vision, embed, decoder = (
    ort.InferenceSession(f"onnx/{{n}}.onnx")
    for n in ("vision_encoder", "embed_tokens", "decoder_model_merged")
)
image_token = processor.tokenizer.convert_tokens_to_ids(processor.image_token)
messages = [{{"role": "user", "content": [{{"type": "image"}}, {{"type": "text", "text": "{question}"}}]}}]
prompt = processor.apply_chat_template(messages, add_generation_prompt=True)
x = processor(images=[Image.open("image.png").convert("RGB")], text=[prompt], return_tensors="np")
ids = x["input_ids"]
emb = embed.run(None, {{"input_ids": ids}})[0]
feeds = {{  # pixel_values, and Idefics3's pixel_attention_mask (bool)
    i.name: x[i.name].astype(bool if i.type == "tensor(bool)" else np.float32)
    for i in vision.get_inputs()
}}
features = vision.run(None, feeds)[0]
emb[ids == image_token] = features.reshape(-1, emb.shape[-1])  # the image tokens, in order
past = {{
    i.name: np.zeros((1, i.shape[1], 0, i.shape[3]), np.float32)
    for i in decoder.get_inputs() if i.name.startswith("past_key_values")
}}
answer, mask = [], np.ones((1, 0), np.int64)
for _ in range(16):  # greedy
    mask = np.ones((1, mask.shape[1] + emb.shape[1]), np.int64)
    pos = np.arange(mask.shape[1] - emb.shape[1], mask.shape[1])[None]
    out = decoder.run(None, {{"inputs_embeds": emb, "attention_mask": mask, "position_ids": pos, **past}})
    past = dict(zip(past, out[1:]))
    token = int(out[0][0, -1].argmax())
    if token == processor.tokenizer.eos_token_id:
        break
    answer.append(token)
    emb = embed.run(None, {{"input_ids": np.array([[token]])}})[0]
print(processor.tokenizer.decode(answer, skip_special_tokens=True))
"""
