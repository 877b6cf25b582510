"""The ONNX export of a vision-language model (``image-text-to-text``: LLaVA-style, Idefics3 or
Qwen2-VL, ``LAYOUTS``), in the layout transformers.js opens for it, checked graph by graph and by
generating. A family's part (its vision graph and inputs, its image features, its processor
files, its decoder positions and config.json) is a ``Layout``; the rest is shared.

The folder (``export_image_text_to_text``) is a model folder: the three graphs under ``onnx/``
(``ortft.families.vision_language.vlm_graphs``; a family's vision graph in its
``*_graphs`` module), ``config.json``,
``generation_config.json``, the processor (``processor_config.json`` with the image token and
the patch size, ``preprocessor_config.json``: the image processor, which transformers.js reads
from that file alone, the tokenizer files and the chat template) and ``export.json``.

The checks (export.json):
- ``parity``: each graph against the PyTorch module it was traced from, on the samples' images
  and prompts: ``vision_encoder`` (image features), ``embed_tokens`` (embeddings) and the
  decoder, fed PyTorch's merged prompt embeddings with an empty past, against the model's
  logits over the prompt (``graphs``: each one's max |diff|; ``max_abs_diff``: the largest).
- ``generation``: the three graphs generating greedily in numpy (embed, scatter the image
  features at the image tokens, decode with the cache) against PyTorch's ``generate`` on the
  same image and prompt, with the model's generation config: tokens equal and each compared
  step's logits within the tolerance (``ortft.export.decoder.compare``).
- ``preprocess``: ``onnx/preprocess.onnx`` (decoded uint8 RGB pixels -> ``pixel_values``, the
  image classifier's graph: ``ortft.families.vision.preprocess``) against the image processor's
  PIL output on the samples' images, within one pixel step; a failed check fails the export. A
  processor the graph cannot express (Idefics3's and Qwen2-VL's) gets none, and it says why.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from ortft.core.errors import InputError
from ortft.core.reports import ExportReport, ParityReport
from ortft.export import decoder, parity
from ortft.families.vision_language import idefics3_graphs, qwen2vl_graphs
from ortft.families.vision_language import vlm_graphs as graphs

TASK = "image-text-to-text"
SYNTHETIC_SAMPLES = 2
SYNTHETIC_QUESTIONS = ("What is in the image?", "Which colour is it?")


class Layout(Protocol):
    """What a model family changes in the export (the rest is shared): the vision graph and
    its inputs, the model's own image features, the processor's files, the decoder's
    positions and config.json (``vlm_graphs.SharedLayout``: those most families share)."""

    position_rows: int  # 0: position_ids [batch, sequence]; else [rows, batch, sequence]

    def accepts(self, model: Any) -> bool: ...

    def check(self, model: Any) -> None:
        """Raise ``InputError`` for a model of the family the export cannot write."""
        ...

    def vision_graph(self, model: Any, inputs: list[Any]) -> graphs.VisionGraph: ...

    def vision_feeds(self, x: Any) -> dict[str, np.ndarray]:
        """The vision graph's feeds from the processor's output (``pixel_values`` first)."""
        ...

    def reference_features(self, model: Any, x: Any) -> torch.Tensor:
        """The model's image features for the processor's output ``x``, [..., hidden]."""
        ...

    def save_processor(self, processor: Any, folder: Path) -> dict[str, Any]: ...

    def save_config(self, model: Any, folder: Path) -> None:
        """config.json and generation_config.json."""
        ...

    def image_count(self, x: Any) -> int: ...

    def prompt_positions(self, model: Any, x: Any, mask: np.ndarray) -> np.ndarray:
        """The decoder's ``position_ids`` for a prompt batch (``x``: the processor's output,
        ``mask``: its attention mask)."""
        ...

    def steps(self, sessions: graphs.Sessions, model: Any, x: Any) -> graphs.Steps:
        """The generation loop over the three graphs for the processor's output ``x``."""
        ...


class _Llava(graphs.SharedLayout):
    """LLaVA-style models (the default: its vision encoder refuses what it cannot write)."""

    def accepts(self, model: Any) -> bool:
        return True

    def check(self, model: Any) -> None:
        graphs.VisionEncoder(model)

    def vision_graph(self, model: Any, inputs: list[Any]) -> graphs.VisionGraph:
        pixels = torch.cat([x["pixel_values"] for x in inputs]).numpy()
        return graphs.llava_vision(model, pixels)

    def vision_feeds(self, x: Any) -> dict[str, np.ndarray]:
        return {"pixel_values": x["pixel_values"].numpy()}

    def reference_features(self, model: Any, x: Any) -> torch.Tensor:
        return graphs.reference_features(model, x["pixel_values"])

    def save_processor(self, processor: Any, folder: Path) -> dict[str, Any]:
        return save_processor(processor, folder)


LAYOUTS: tuple[Layout, ...] = (idefics3_graphs.LAYOUT, qwen2vl_graphs.LAYOUT, _Llava())


def layout_for(model: Any) -> Layout:
    """The first of ``LAYOUTS`` that takes ``model`` (LLaVA's last)."""
    return next(layout for layout in LAYOUTS if layout.accepts(model))


@dataclass(frozen=True)
class Sample:
    """One image and the prompt to answer about it (the chat template applied, image token in)."""

    image: Any  # a PIL image
    prompt: str


def export_image_text_to_text(
    model: Any,
    processor: Any,
    out_dir: Path,
    *,
    opset: int = 20,
    tolerance: float = 1e-4,
    samples: list[Sample] | None = None,
) -> ExportReport:
    """Export ``model`` (a ``LlavaForConditionalGeneration``, an
    ``Idefics3ForConditionalGeneration`` or a ``Qwen2VLForConditionalGeneration``: ``LAYOUTS``) with ``processor`` to ``out_dir``,
    check it, write export.json; the report's ``passed`` says whether every check passed (the
    folder is then ``out_dir``, else ``out_dir.failed``: ``parity.publish``). ``samples``: the
    images and prompts the checks run on; None: ``SYNTHETIC_SAMPLES`` noise images."""
    build = builder(model, processor, opset=opset, tolerance=tolerance, samples=samples)
    return parity.publish(Path(out_dir), build.build)


def builder(
    model: Any, processor: Any, *, opset: int, tolerance: float, samples: list[Sample] | None
) -> _Build:
    """The staging folder's builder (``_Build.build``) of ``export_image_text_to_text``, for a
    caller that publishes the folder itself (the exporter: ``ortft train``, ``ortft export``).
    A model the export cannot write is refused here, before anything is traced."""
    model = model.eval().to("cpu")
    layout = layout_for(model)
    layout.check(model)
    source = "samples" if samples else "synthetic"
    rows = samples or synthetic_samples(processor)
    return _Build(model, processor, rows, opset, tolerance, source, layout)


def synthetic_samples(processor: Any, n: int = SYNTHETIC_SAMPLES) -> list[Sample]:
    """``n`` noise images (different sizes: the processor resizes them) with a question each,
    through the processor's chat template."""
    from PIL import Image

    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        pixels = rng.integers(0, 256, (20 + 4 * i, 24, 3)).astype(np.uint8)
        question = SYNTHETIC_QUESTIONS[i % len(SYNTHETIC_QUESTIONS)]
        out.append(Sample(Image.fromarray(pixels), prompt_for(processor, question)))
    return out


def prompt_for(processor: Any, question: str) -> str:
    """One user turn (an image, then ``question``) and the generation prompt, by the
    processor's chat template."""
    if not getattr(processor, "chat_template", None):
        raise InputError(
            f"{type(processor).__name__} has no chat template: pass the check's prompts "
            "(samples=[Sample(image, prompt), ...]) with the image token in them"
        )
    messages = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}
    ]
    return processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def save_processor(processor: Any, folder: Path) -> dict[str, Any]:
    """The processor as transformers and transformers.js both read it; export.json's
    ``preprocessor``.

    transformers.js's ``LlavaProcessor`` (4.3.1) expands the image
    token to patches + ``num_additional_image_tokens`` and ignores
    ``vision_feature_select_strategy``, where transformers takes one off for ``default`` (the
    model drops the CLS position): one token more than the image features, which it refuses.
    ``default`` with k additional tokens is written as ``full`` with k - 1: the same count in
    both (the strategy is only a count in the processor; the model's config keeps its own)."""
    import json

    graphs.write_processor(processor, folder, "LlavaProcessor")
    path = folder / "processor_config.json"
    config = json.loads(path.read_text())
    extra = int(config.get("num_additional_image_tokens") or 0)
    if config.get("vision_feature_select_strategy") == "default":
        config.update(vision_feature_select_strategy="full", num_additional_image_tokens=extra - 1)
        path.write_text(json.dumps(config, indent=2) + "\n")
    return {
        "file": "preprocessor_config.json",
        "class": type(processor.image_processor).__name__,
        "processor": type(processor).__name__,
        "image_tokens": "patches + num_additional_image_tokens (processor_config.json)",
    }


class _Build:
    """``build`` fills the staging folder and returns export.json's report."""

    def __init__(
        self,
        model: Any,
        processor: Any,
        rows: list[Sample],
        opset: int,
        tolerance: float,
        source: str,
        layout: Layout,
    ):
        self.model, self.processor, self.rows = model, processor, rows
        self.opset, self.tolerance, self.source = opset, tolerance, source
        self.layout = layout
        self.inputs = [
            processor(images=[r.image], text=[r.prompt], return_tensors="pt") for r in rows
        ]
        self.image_token = int(model.config.image_token_id)
        self.check_counts()

    def check_counts(self) -> None:
        """Each prompt's image tokens, as the processor expanded them, against the image
        features the model gives: a processor of another model is one line, before exporting."""
        for row, x in zip(self.rows, self.inputs, strict=True):
            tokens = int((x["input_ids"] == self.image_token).sum())
            try:
                with torch.no_grad():
                    shape = self.layout.reference_features(self.model, x).shape
            except RuntimeError as e:  # the model's own reshape of patches it cannot take
                raise InputError(
                    f"the model cannot take the processor's image (prompt {row.prompt[:40]!r}): "
                    f"{str(e).splitlines()[0]}; a processor of another model (patch_size, "
                    "merge_size)?"
                ) from None
            features = int(np.prod(shape[:-1]))
            if tokens != features:
                raise InputError(
                    f"the processor gives {tokens} image tokens for {self.layout.image_count(x)} "
                    f"image(s) but the model {features} image features (prompt "
                    f"{row.prompt[:40]!r}): patch_size, num_additional_image_tokens or "
                    "vision_feature_select_strategy of another model?"
                )

    def build(self, tmp: Path) -> ExportReport:
        from ortft.export import deploy
        from ortft.export import onnx_tools as tools

        model = self.model
        vision = self.layout.vision_graph(model, self.inputs)
        rows = self.layout.position_rows
        names = graphs.export_graphs(model, vision, tmp, self.opset, rows)
        preprocessor = self.layout.save_processor(self.processor, tmp)
        self.layout.save_config(model, tmp)
        sessions = graphs.Sessions(tmp, self.image_token)
        files = {
            "vision_encoder": graphs.VISION,
            "embed_tokens": graphs.EMBED,
            "decoder": graphs.DECODER,
        }
        result: ExportReport = {
            "format_version": parity.EXPORT_FORMAT_VERSION,
            "task": TASK,
            "model_type": getattr(model.config, "model_type", None),
            "opset": self.opset,
            "files": files,
            "bytes": sum((tmp / f).stat().st_size for f in files.values()),
            "export_s": round(float(names.pop("export_s")), 3),
            "inputs": {k: v[0] for k, v in names.items()},
            "outputs": {k: v[1] for k, v in names.items()},
            "kv_cache": True,
            "parity": self.parity(sessions),
            "generation": self.generation(sessions),
            "preprocessor": preprocessor,
            "exporter": tools.exporter(),
            "ir_version": deploy.ir_version(tmp / graphs.DECODER),
        }
        result["preprocess"] = self.preprocess(tmp)
        if result["preprocess"].get("passed"):
            files["preprocess"] = graphs.PREPROCESS
        result["runtimes"] = [deploy.checked_runtime("loaded; parity and generation checked")]
        return result

    def preprocess(self, tmp: Path) -> dict[str, Any]:
        """export.json's ``preprocess``: ``onnx/preprocess.onnx`` (the image classifier's graph,
        ``ortft.families.vision.graphs.preprocess``), raw uint8 RGB pixels to the vision
        encoder's ``pixel_values``, checked against the image processor on the samples' images;
        or why the processor has none (Idefics3's tiles, Qwen2-VL's flattened patches)."""
        from ortft.families.vision.graphs import preprocess

        pics = [np.asarray(r.image.convert("RGB"), dtype=np.uint8) for r in self.rows]
        image_processor = self.processor.image_processor
        return preprocess(image_processor, tmp, graphs.PREPROCESS, pics, self.source)

    def parity(self, sessions: graphs.Sessions) -> ParityReport:
        """Each graph against its PyTorch module (see the module doc)."""
        model, diffs = self.model, {"vision_encoder": 0.0, "embed_tokens": 0.0, "decoder": 0.0}
        embed = graphs.EmbedTokens(model).eval()
        for x in self.inputs:
            ids = x["input_ids"]
            with torch.no_grad():
                features = self.layout.reference_features(model, x).numpy()
                embeds = embed(ids).numpy()
            got = {
                "vision_encoder": sessions.image_features(**self.layout.vision_feeds(x)),
                "embed_tokens": sessions.embeds(ids.numpy()),
            }
            want = {"vision_encoder": features, "embed_tokens": embeds}
            for name, value in got.items():
                value = value.reshape(want[name].shape)  # Idefics3's features: one per token
                diffs[name] = max(diffs[name], float(np.max(np.abs(value - want[name]))))
        diffs["decoder"] = self.decoder_parity(sessions)
        tol = self.tolerance
        section: ParityReport = {
            "samples": len(self.inputs),
            "source": self.source,
            "against": "each graph's PyTorch module; the decoder: the model's logits over the "
            "prompts, one left-padded batch",
            "max_abs_diff": float(np.max(list(diffs.values()))),  # NaN stays NaN: a failure
            "tolerance": tol,
            "graphs": {
                k: {"max_abs_diff": d, "tolerance": tol, "passed": d <= tol}
                for k, d in diffs.items()
            },
        }
        section["passed"] = parity.passed("parity", section)
        return section

    def decoder_parity(self, sessions: graphs.Sessions) -> float:
        """The decoder, fed PyTorch's merged embeddings of every prompt in one left-padded
        batch (so its ``position_ids`` matter) and an empty past, against the model's logits
        at the prompts' positions; max |diff|."""
        model = self.model
        images, prompts = [r.image for r in self.rows], [r.prompt for r in self.rows]
        x = self.processor(
            images=images, text=prompts, padding=True, padding_side="left", return_tensors="pt"
        )
        with torch.no_grad():
            features = self.layout.reference_features(model, x).numpy()
            embeds = graphs.EmbedTokens(model).eval()(x["input_ids"]).numpy()
            want = model(**x, use_cache=False).logits.numpy()
        mask = x["attention_mask"].numpy().astype(np.int64)
        feeds = {
            "inputs_embeds": graphs.merge(
                embeds, x["input_ids"].numpy(), features, self.image_token
            ),
            "attention_mask": mask,
            "position_ids": self.layout.prompt_positions(model, x, mask),
            **parity.empty_past(sessions.decoder, len(mask)),
        }
        got = sessions.decoder.run(["logits"], feeds)[0]
        real = mask == 1  # a padded position's logits are no prediction
        return float(np.max(np.abs(got[real] - want[real])))

    def generation(self, sessions: graphs.Sessions) -> dict[str, Any]:
        """Greedy (or the model's beams) on the three graphs against PyTorch's ``generate``."""
        from ortft.export import generation as gen

        model = self.model
        gc = decoder.check_config(model, decoder.GENERATE_TOKENS)
        text = model.config.get_text_config()
        positions = getattr(text, "max_position_embeddings", None)
        totals = np.zeros(3, dtype=np.int64)  # steps compared, prompts that diverged, ties
        max_diff = 0.0
        for x in self.inputs:
            ref = decoder.reference(model, gc, **x)
            ids = x["input_ids"].numpy()
            p = gen.plan(gc, ids.shape[1], encoder_decoder=False, max_positions=positions)
            steps = self.layout.steps(sessions, model, x)
            seq, raw = gen.generate(steps, ids, p)
            eos = set() if p.eos is None else {int(e) for e in p.eos}
            *counts, diff = decoder.compare(ref, seq, raw, ids.shape[1], eos, p.num_beams)
            totals, max_diff = totals + counts, max(max_diff, diff)
        head = {
            "method": decoder.method(gc, decoder.GENERATE_TOKENS)
            + "; the ONNX side embeds, merges the image features and decodes in numpy",
            "num_beams": int(gc.num_beams or 1),
            "prompts": len(self.inputs),
        }
        compared, mismatches, ties = (int(n) for n in totals)
        return decoder.section(head, (compared, mismatches, ties), max_diff, self.tolerance)
