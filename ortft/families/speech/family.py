"""Speech recognition as the core sees it: the task (``task.SpeechRecognition``) with the
protocols of ``ortft.tasks.protocols`` it implements: its recipe rules, its processor, its
export, its runner and its ``ortft predict``. Each hook imports torch or transformers lazily,
so building the task for ``ortft validate`` stays torch-free."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ortft.core.reports import ExportReport, Prediction
from ortft.families.speech.task import Options, SpeechRecognition
from ortft.tasks.protocols import Builder

log = logging.getLogger("ortft")


class Speech(SpeechRecognition):
    """``SpeechRecognition`` with the protocol hooks the core calls."""

    def recipe_problems(self, recipe: Any) -> Iterator[str]:
        """A from_config Whisper needs a tokenizer with Whisper's special tokens; a model
        folder brings its own (its processor)."""
        tok, model = recipe.model.tokenizer, recipe.model
        if model.from_config and not tok.path and not tok.train:
            yield "a model built from_config needs model.tokenizer.path or model.tokenizer.train"
        if tok.train and tok.train.kind != "byte-bpe":
            yield (
                f"model.tokenizer.train.kind={tok.train.kind}: Whisper's tokenizer is "
                "byte-level BPE; set kind: byte-bpe"
            )
        if model.name_or_path and (tok.path or tok.train):
            yield (
                f"model.tokenizer: {self.name} uses the tokenizer saved with "
                f"model.name_or_path (its processor); remove model.tokenizer"
            )

    def load_processor(self, loaded: Any, source: str | None, saved: Path | None, rows: Any) -> Any:
        """The model's processor (feature extractor + tokenizer), or for a from_config model
        one sized to its config, with model.tokenizer.path's tokenizer or one trained on the
        transcripts with Whisper's special tokens."""
        from ortft.backends.torch import hf_config, models
        from ortft.families.speech import processor

        found = processor.load(loaded, source, saved)
        if found is not None:
            return found
        spec = loaded.recipe.model
        tokenizer = models.load_tokenizer(loaded)
        if tokenizer is None:
            texts = self.texts(rows, loaded.recipe.data)
            tokenizer = processor.train_tokenizer(texts, spec.tokenizer.train, self.language)
            log.info("trained a Whisper byte-bpe tokenizer: %d tokens", len(tokenizer))
        config = hf_config.generic_config(spec.from_config, tokenizer, spec.dropout)
        return processor.for_config(config, tokenizer)

    def processor_from_folder(self, folder: Path, field: str = "model") -> Any:
        from ortft.families.speech import processor

        return processor.from_folder(str(folder), field)

    def export_builder(
        self, model: Any, processor: Any, opset: int, tolerance: float, samples: Any, options: Any
    ) -> Builder:
        """features.onnx, encoder_model.onnx and decoder_model_merged.onnx (``graphs.SpeechGraphs``), each checked
        against PyTorch, then in the other runtimes the options name."""
        from ortft.core.errors import InputError, RunError, first_line
        from ortft.export.exporter import PARITY_SAMPLES, finished
        from ortft.export.parity import wanted
        from ortft.families.speech.graphs import SpeechGraphs

        if wanted(options.optimize, options.fp16, options.quantize) or options.training:
            raise InputError(
                f"{self.name} exports the encoder and decoder graphs only: --optimize, --fp16, "
                "--quantize and --training-artifacts are for single-graph models"
            )
        model = model.eval().to("cpu")
        job = SpeechGraphs(
            model,
            processor,
            self,
            opset=opset,
            tolerance=tolerance,
            samples=samples,
            n=PARITY_SAMPLES,
        )

        def build(tmp: Path) -> ExportReport:
            try:
                result = job.build(tmp)
            except RuntimeError as err:  # the tracer's failures
                raise RunError(f"ONNX export (opset {opset}) failed: {first_line(err)}") from err
            feeds = job.runtime_feeds
            return finished(
                tmp, result, feeds, tolerance, options, self.name, processor, model.config
            )

        return build

    def open_export(self, folder: Path, config: Any) -> Any:
        """``OnnxWhisper`` over the export's encoder_model.onnx and decoder_model_merged.onnx
        (an older export's encoder.onnx: refused, naming the re-export)."""
        from ortft.export.cross_cache import ENCODER, OLD_ENCODER
        from ortft.families.speech.runner import OnnxWhisper

        found = (folder / ENCODER).exists() or (folder / OLD_ENCODER).exists()
        return OnnxWhisper(folder, config) if found else None

    def batch_logits(self, model: Any, runtime: str, batch: dict[str, np.ndarray]) -> np.ndarray:
        """The teacher-forced logits of a collated batch (its features, its labels)."""
        feats = np.ascontiguousarray(batch[self.feature_key], dtype=np.float32)
        if runtime == "onnxruntime":
            return model.logits(feats, batch["labels"])
        import torch

        with torch.no_grad():
            out = model(
                **{self.feature_key: torch.from_numpy(feats)},
                labels=torch.from_numpy(batch["labels"]),
                decoder_attention_mask=torch.from_numpy(batch["decoder_attention_mask"]),
                use_cache=False,
                return_dict=True,
            )
        return out.logits.float().numpy()

    def card(self, report: ExportReport) -> tuple[str, str, str, str]:
        from ortft.families.speech import card

        return card.card(report)

    def predict_files(
        self, model: Any, input_path: str, batch_size: int, max_new_tokens: int
    ) -> Iterator[Prediction]:
        """Each audio file's transcript (clips over the model's window are cut)."""
        from ortft.families.speech import predict

        return predict.run(model, input_path, batch_size, max_new_tokens)


def build(options: Options) -> Speech:
    return Speech(options)
