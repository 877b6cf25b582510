"""Image classification as the core sees it: the task (``task.ImageClassification``) with the
protocols of ``ortft.tasks.protocols`` it implements: its recipe rule, its image processor, its
export, its eval logits, its model card and its ``ortft predict``. Each hook imports torch,
transformers or onnxruntime lazily, so building the task for ``ortft validate`` stays torch-free."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ortft.core.reports import ExportReport, Prediction
from ortft.families.vision.task import ImageClassification, Options
from ortft.tasks.protocols import Builder, JsCall


class Vision(ImageClassification):
    """``ImageClassification`` with the protocol hooks the core calls."""

    def recipe_problems(self, recipe: Any) -> Iterator[str]:
        """An image model has no tokenizer: its image processor reads the files."""
        tok = recipe.model.tokenizer
        if tok.path or tok.train:
            yield (
                f"model.tokenizer: {self.name} reads {self.modality}s, not text (it uses the "
                "model's image processor); remove model.tokenizer"
            )

    def load_processor(self, loaded: Any, source: str | None, saved: Path | None, rows: Any) -> Any:
        """The image processor (PIL backend) of the resumed run or the model folder, or for a
        from_config model a ViT-style one sized to its config's image_size."""
        from ortft.backends.torch import hf_config
        from ortft.families.vision import processor

        found = processor.load(loaded, source, saved)
        if found is not None:
            return found
        spec = loaded.recipe.model
        config = hf_config.generic_config(spec.from_config, None, spec.dropout)
        return processor.for_config(config)

    def processor_from_folder(self, folder: Path, field: str = "model") -> Any:
        """A trained model folder's image processor on its PIL backend, as training ran it (its
        error names the folder itself, not ``field``)."""
        from ortft.families.vision import processor

        return processor.from_folder(str(folder))

    def graph_builder(
        self,
        model: Any,
        processor: Any,
        opset: int,
        tolerance: float,
        samples: Any,
        kinds: list[str],
        options: Any,
    ) -> Builder:
        """model.onnx on pixel_values (+ the variants) and preprocess.onnx on the decoded image
        (``graphs.ImageGraph``), then the other runtimes the options name and the model card."""
        from ortft.export.exporter import PARITY_SAMPLES, finished
        from ortft.families.vision.graphs import ImageGraph

        job = ImageGraph(
            model,
            processor,
            self,
            opset=opset,
            tolerance=tolerance,
            samples=samples,
            kinds=kinds,
            n=PARITY_SAMPLES,
        )

        def build(tmp: Path) -> ExportReport:
            result = job.build(tmp)
            feeds = job.runtime_feeds
            return finished(
                tmp, result, feeds, tolerance, options, self.name, processor, model.config
            )

        return build

    def open_export(self, folder: Path, config: Any) -> Any:
        """None: the export's model.onnx is one graph the plain ONNX session runs."""
        return None

    def batch_logits(self, model: Any, runtime: str, batch: dict[str, np.ndarray]) -> np.ndarray:
        """The logits of a collated batch's pixel_values (the processor's, as training's eval)."""
        from ortft.families.vision.predict import logits

        return logits(model, runtime, batch["pixel_values"])

    def card(self, report: ExportReport) -> tuple[str, str, str, str]:
        from ortft.families.vision import graphs

        return graphs.card(report)

    def js_call(self, processor: Any, report: ExportReport) -> JsCall | None:
        """transformers.js's ``image-classification`` pipeline on the card's image (it decodes
        and resizes the file itself)."""
        from ortft.families.vision import graphs

        return "image-classification", [graphs.CARD_IMAGE], {}

    def predict_files(
        self, model: Any, input_path: str, batch_size: int, max_new_tokens: int
    ) -> Iterator[Prediction]:
        """Each image file's label, its scores and top 5 (``max_new_tokens``: not used)."""
        from ortft.families.vision import predict

        return predict.run(model, input_path, batch_size)


def build(options: Options) -> Vision:
    return Vision(options)
