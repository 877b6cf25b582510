"""Vision-language as the core sees it: the task (``task.ImageTextToText``) with the protocols of
``ortft.tasks.protocols`` it implements: its recipe rules, its processor, its composed config,
the frozen vision tower run outside the trained module, LoRA on the language model, eval's
exact match, ``ortft eval``'s logits and ``ortft predict``. Each hook imports torch or
transformers lazily, so building the task for ``ortft validate`` stays torch-free.

The ONNX export (``export_builder``: the three graphs of ``export``, published by the
exporter as every family's) is ``exporting``'s.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ortft.core.constants import IGNORE_INDEX
from ortft.core.reports import Prediction
from ortft.families.vision_language.task import START, ImageTextToText, Options, normalized

log = logging.getLogger("ortft")

LANGUAGE_TARGETS = ["q_proj", "v_proj"]  # Llama's attention projections (LoRA's default)


class VisionLanguage(ImageTextToText):
    """``ImageTextToText`` with the protocol hooks the core calls."""

    def recipe_problems(self, recipe: Any) -> Iterator[str]:
        tok, model = recipe.model.tokenizer, recipe.model
        if model.from_config and not tok.path and not tok.train:
            yield "a model built from_config needs model.tokenizer.path or model.tokenizer.train"
        if model.name_or_path and (tok.path or tok.train):
            yield (
                f"model.tokenizer: {self.name} uses the tokenizer saved with "
                "model.name_or_path (its processor); remove model.tokenizer"
            )
        if model.from_config:
            from ortft.families.vision_language.archs import ARCHS

            if model.from_config.architecture not in ARCHS:
                yield (
                    f"model.from_config.architecture={model.from_config.architecture}: "
                    f"{self.name} builds {' or '.join(ARCHS)} from a config; a pretrained "
                    "model loads from model.name_or_path"
                )
        if recipe.adapter is not None and not self.options.freeze_vision:
            yield (
                "task.freeze_vision=false with an adapter: LoRA adapts the language model and "
                "the vision tower stays frozen; set task.freeze_vision=true or drop the adapter"
            )

    def load_processor(self, loaded: Any, source: str | None, saved: Path | None, rows: Any) -> Any:
        """The model's processor (as its architecture trains: ``archs.Arch.ready``), or for a
        from_config model its architecture's processor (``LlavaProcessor``,
        ``Idefics3Processor``, ``Qwen2VLProcessor``) around model.tokenizer.path's tokenizer or
        one trained on the rows' texts."""
        from ortft.backends.torch import models
        from ortft.families.vision_language import archs, processor

        found = processor.load(loaded, source, saved)
        if found is not None:
            return archs.of_processor(found).ready(found)
        tokenizer = models.load_tokenizer(loaded)
        if tokenizer is None:
            spec = loaded.recipe.model.tokenizer.train
            tokenizer = models.train_tokenizer(self.texts(rows, loaded.recipe.data), spec)
            log.info("trained a %s tokenizer: %d tokens", spec.kind, len(tokenizer))
        arch = archs.named(loaded.recipe.model.from_config.architecture)
        return arch.for_config(self.options, tokenizer)

    def processor_from_folder(self, folder: Path, field: str = "model") -> Any:
        from ortft.families.vision_language import processor

        return processor.from_folder(str(folder), field)

    def model_config(self, spec: Any, tokenizer: Any, dropout: float | None) -> Any:
        from ortft.families.vision_language import archs

        arch = archs.named(spec.architecture)
        return arch.model_config(spec, self.options, tokenizer, dropout)

    def prepare_model(self, model: Any, processor: Any) -> None:
        """Freeze the vision tower (``task.freeze_vision``); keep the model for the features
        computed outside the module; generation stops at the tokenizer's end-of-sequence."""
        from ortft.families.vision_language import archs

        self.llava = model  # the features outside the module are its vision tower's
        for p in archs.of(model).vision_parameters(model):
            p.requires_grad_(not self.options.freeze_vision)
        tok = processor.tokenizer
        model.generation_config.eos_token_id = tok.eos_token_id
        model.generation_config.pad_token_id = tok.pad_token_id

    def outside_inputs(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """What the wrapped module takes that no exporter traces (the architecture's
        ``extra_inputs``: Qwen2-VL's rope positions; the positions the head runs at), and a
        frozen vision tower's features, computed eagerly under no_grad before the wrapped
        module (on ort: outside ORTModule, whose graph is then the projector and the language
        model): nothing of the tower needs a gradient, and one graph fewer to export."""
        import torch

        from ortft.families.vision_language import archs
        from ortft.tasks.lm_head import label_positions

        arch = archs.of(self.llava)
        extra = arch.extra_inputs(self.llava, inputs)
        # where the head runs (ortft.tasks.lm_head): an input, so no graph holds a NonZero
        extra["label_index"] = label_positions(inputs["labels"])
        if not self.options.freeze_vision:
            return {**inputs, **extra}
        pixels = {k: v for k, v in inputs.items() if k in arch.pixel_keys}
        rest = {k: v for k, v in inputs.items() if k not in arch.pixel_keys}
        with torch.no_grad():
            rest["image_features"] = arch.vision_features(self.llava, pixels)
        return {**rest, **extra}

    def adapter_targets(self, model: Any, targets: list[str] | None) -> tuple[Any, list[str]]:
        """LoRA on the language model's modules named ``targets`` (default q_proj, v_proj),
        not the vision tower's of the same names; the projector trains in full."""
        from ortft.core.errors import InputError
        from ortft.families.vision_language import archs

        arch = archs.of(model)
        names = targets or LANGUAGE_TARGETS
        inside = f"{arch.language}."
        language = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules() if inside in n}
        missing = [t for t in names if t not in language]
        if missing:
            raise InputError(
                f"adapter.target_modules: {', '.join(missing)} matches no module of the "
                f"language model (it has e.g. {', '.join(sorted(language)[:8])})"
            )
        pattern = rf".*{arch.language}\..*\.(" + "|".join(names) + ")"
        return pattern, [arch.projector]

    def generate_metrics(self, model: Any, tokenizer: Any, encoded: Any) -> dict[str, float]:
        """exact_match: the share of the first ``task.generate_samples`` rows whose greedy
        answer (after the last assistant turn's prompt) equals the row's, lowercased, spaces
        collapsed."""
        n = min(self.options.generate_samples, len(encoded))
        if n == 0:
            return {}
        if tokenizer is not None:
            self.bind(tokenizer)
        from ortft.families.vision_language import archs
        from ortft.families.vision_language.predict import by_length, generate

        keys = archs.of_processor(self.processor).pixel_keys
        starts, right = encoded.column(START), 0
        tok = self.processor.tokenizer
        for lo in range(0, n, 32):  # 32 images a batch: bounded memory
            idx = np.arange(lo, min(n, lo + 32))
            batch = self.collate(encoded.take(idx), None, 0)
            prompts = [batch["input_ids"][j, : int(starts[k])] for j, k in enumerate(idx)]
            for group in by_length(prompts).values():
                vision = {k: batch[k][group] for k in keys if k in batch}
                got = generate(
                    model,
                    self.processor,
                    np.stack([prompts[j] for j in group]),
                    vision,
                    self.options.max_new_tokens,
                )
                for j, (text, _) in zip(group, got, strict=True):
                    gold = batch["labels"][j, int(starts[idx[j]]) :]
                    want = tok.decode(gold[gold != IGNORE_INDEX], skip_special_tokens=True)
                    right += normalized(text) == normalized(want)
        return {"exact_match": right / n}

    def export_builder(
        self, model: Any, processor: Any, opset: int, tolerance: float, samples: Any, options: Any
    ) -> Any:
        """vision_encoder.onnx, embed_tokens.onnx and decoder_model_merged.onnx, checked per
        graph and by generating (``exporting.export_builder``)."""
        from ortft.families.vision_language import exporting

        return exporting.export_builder(self, model, processor, opset, tolerance, samples, options)

    def card(self, report: Any) -> tuple[str, str, str, str]:
        from ortft.families.vision_language import exporting

        return exporting.card(report)

    def open_export(self, folder: Path, config: Any) -> Any:
        """The export's three graphs (``exporting.OnnxVisionLanguage``); None for a model
        folder (``ortft eval`` and ``ortft predict`` run the PyTorch model)."""
        from ortft.families.vision_language import exporting
        from ortft.families.vision_language.vlm_graphs import DECODER

        found = (folder / DECODER).is_file()
        return exporting.OnnxVisionLanguage(folder, config) if found else None

    def batch_logits(self, model: Any, runtime: str, batch: dict[str, np.ndarray]) -> np.ndarray:
        """The logits of a collated batch: the export's graphs, or transformers' own forward
        on its pixel_values."""
        if runtime == "onnxruntime":
            return model.logits(batch)
        import torch

        from ortft.families.vision_language import archs

        arch = archs.of(model)
        ids = torch.from_numpy(batch["input_ids"])
        vision = {k: batch[k] for k in arch.pixel_keys if k in batch}
        with torch.no_grad():
            out = model(
                input_ids=ids,
                attention_mask=torch.from_numpy(batch["attention_mask"]),
                **arch.model_inputs(model, ids, vision),
                use_cache=False,
                return_dict=True,
            )
        return out.logits.float().numpy()

    def predict_files(
        self, model: Any, input_path: str, batch_size: int, max_new_tokens: int
    ) -> Iterator[Prediction]:
        """Each JSONL row's answer (its image, its question or conversation)."""
        from ortft.families.vision_language import predict

        return predict.run(self, model, input_path, batch_size, max_new_tokens)


def build(options: Options) -> VisionLanguage:
    return VisionLanguage(options)
