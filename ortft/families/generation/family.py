"""Text generation as the core sees it: the three tasks (``causal_lm.CausalLM``,
``instruction.Instruction``, ``seq2seq.Seq2Seq``) with the protocols of ``ortft.tasks.protocols``
they implement. A decoder (causal-lm, instruction) exports one graph under the exporter's
single-graph rules, with or without its KV cache (``ExportsDecoder``), its logits per position
(``LogitsPerPosition``); seq2seq exports its
encoder and decoder graphs (``ExportsGraphs``) and runs them for eval (``OwnRunner``). Each one
writes its model card's code (``WritesSnippet``) and answers ``ortft predict`` with the text
``generate`` gives (``PredictsLines``). Each hook imports torch, transformers or onnxruntime
lazily, so building a task for ``ortft validate`` stays torch-free."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ortft.core.reports import ExportReport, Prediction
from ortft.families.generation import causal_lm, instruction, seq2seq
from ortft.families.generation.head import HeadAtLabels
from ortft.tasks.base import Task
from ortft.tasks.protocols import Builder, JsCall


class TextPrompt:
    """What ``ortft predict`` and the card feed the model for one input text: the text
    (instruction formats it as its training prompt, in its own class)."""

    def prompt(self, text: str, tokenizer: Any) -> str:
        return text


class DecoderHooks(TextPrompt, Task):
    """The hooks causal-lm and instruction share (listed after the task in their bases, so the
    task's own members come first)."""

    positions = "next-token"  # parity: position t predicts t+1 (``LogitsPerPosition``)

    def cached_graph(self, model: Any, example: tuple[Any, ...]) -> Any:
        from ortft.families.generation import decoder_graph

        return decoder_graph.graph(model, example)

    def generation_check(
        self, model: Any, path: Path, feeds: dict[str, np.ndarray], tolerance: float
    ) -> dict[str, Any]:
        from ortft.families.generation import decoder_graph

        return decoder_graph.generation_check(model, path, feeds, tolerance)

    def genai_config(self, folder: Path, config: Any, report: ExportReport) -> dict[str, Any]:
        """genai_config.json where onnxruntime-genai runs the export (``genai``)."""
        from ortft.families.generation import genai

        return genai.write(folder, config, report)

    def quantized_check(
        self, model: Any, fp32: Path, variant: Path, feeds: dict[str, np.ndarray], cache: bool
    ) -> dict[str, Any]:
        from ortft.families.generation import quantized

        return quantized.quality(model, fp32, variant, feeds, cache)

    def snippet(self, tokenizer: Any, report: ExportReport) -> str:
        """The loop with the cache or without, on the example as the task's prompt."""
        from ortft.families.generation import card

        return card.decoder(self.prompt(card.example(), tokenizer), report.get("kv_cache"))

    def js_call(self, tokenizer: Any, report: ExportReport) -> JsCall | None:
        """transformers.js's ``text-generation`` pipeline, greedy, on the card's prompt as the
        task formats it, without special tokens (as ``ortft predict`` encodes it)."""
        from ortft.families.generation import card

        options = {"max_new_tokens": 32, "do_sample": False, "return_full_text": False}
        options["add_special_tokens"] = False
        return "text-generation", [self.prompt(card.example(), tokenizer)], options

    def predict_lines(
        self,
        model: Any,
        inputs: list[tuple[str, dict[str, Any]]],
        max_new_tokens: int,
        max_length: int | None,
        batch_size: int,
    ) -> Iterator[Prediction]:
        """Each text's continuation (``max_length``, ``batch_size``: not used: one prompt at a
        time, its end kept within the model's positions)."""
        from ortft.families.generation import predict
        from ortft.inference.predict import input_texts

        return predict.decoder(model, input_texts(inputs), max_new_tokens)


class CausalDecoder(HeadAtLabels, causal_lm.CausalLM, DecoderHooks):
    """``CausalLM`` with the decoder's hooks, its head at the labelled positions."""


class InstructionDecoder(HeadAtLabels, instruction.Instruction, DecoderHooks):
    """``Instruction`` with the decoder's hooks (its prompt: the training template's), its head
    at the labelled positions."""


class Seq2SeqPair(seq2seq.Seq2Seq, TextPrompt):
    """``Seq2Seq`` with the hooks of its encoder and decoder graphs."""

    def export_builder(
        self, model: Any, processor: Any, opset: int, tolerance: float, samples: Any, options: Any
    ) -> Builder:
        """encoder_model.onnx and decoder_model_merged.onnx (``seq2seq_graphs``), checked against PyTorch, then in
        the other runtimes the options name (``processor``: the tokenizer)."""
        from ortft.core.errors import InputError, RunError, first_line
        from ortft.export import generation
        from ortft.export.exporter import PARITY_SAMPLES, finished
        from ortft.export.parity import wanted
        from ortft.export.rows import parity_feeds, samples_source
        from ortft.families.generation import seq2seq_graphs

        if wanted(options.optimize, options.fp16, options.quantize) or options.training is not None:
            raise InputError(
                f"{self.name} exports the encoder and decoder graphs only: --optimize, --fp16, "
                "--quantize and --training-artifacts are for single-graph models"
            )
        model = model.eval().to("cpu")
        feeds = parity_feeds(samples, processor, PARITY_SAMPLES)

        def build(tmp: Path) -> ExportReport:
            try:
                result = seq2seq_graphs.build_report(
                    model,
                    tmp,
                    samples,
                    feeds,
                    opset=opset,
                    tolerance=tolerance,
                    source=samples_source(samples),
                )
            except RuntimeError as err:  # the tracer's failures
                raise RunError(f"ONNX export (opset {opset}) failed: {first_line(err)}") from err
            processor.save_pretrained(tmp)
            generation.save(model, tmp)  # config.json, generation_config.json
            config, length = model.config, options.max_length  # the card, export.json
            return finished(
                tmp, result, feeds, tolerance, options, self.name, processor, config, length
            )

        return build

    def open_export(self, folder: Path, config: Any) -> Any:
        """``OnnxSeq2Seq`` over the export's encoder_model.onnx and decoder_model_merged.onnx
        (an older export's encoder.onnx: refused, naming the re-export)."""
        from ortft.export.cross_cache import ENCODER, OLD_ENCODER
        from ortft.families.generation.seq2seq_graphs import OnnxSeq2Seq

        found = (folder / ENCODER).exists() or (folder / OLD_ENCODER).exists()
        return OnnxSeq2Seq(folder, config) if found else None

    def batch_logits(self, model: Any, runtime: str, batch: dict[str, np.ndarray]) -> np.ndarray:
        """The teacher-forced logits of a collated batch: the decoder fed its labels, shifted
        right (by the model itself, or by the runner as the model would)."""
        ids, mask, labels = batch["input_ids"], batch["attention_mask"], batch["labels"]
        if runtime == "onnxruntime":
            return model.logits(ids, mask, labels)
        import torch

        with torch.no_grad():
            out = model(
                input_ids=torch.from_numpy(ids),
                attention_mask=torch.from_numpy(mask),
                return_dict=True,
                use_cache=False,
                labels=torch.from_numpy(labels),
            )
        return out.logits.float().numpy()

    def snippet(self, tokenizer: Any, report: ExportReport) -> str:
        from ortft.families.generation import card

        return card.seq2seq()

    def predict_lines(
        self,
        model: Any,
        inputs: list[tuple[str, dict[str, Any]]],
        max_new_tokens: int,
        max_length: int | None,
        batch_size: int,
    ) -> Iterator[Prediction]:
        """Each text's output, its source cut to ``max_length`` (else the training length)."""
        from ortft.families.generation import predict
        from ortft.inference.predict import input_length, input_texts

        length = input_length(model, max_length)
        return predict.seq2seq(model, input_texts(inputs), max_new_tokens, length, batch_size)


def build_causal_lm(options: causal_lm.Options) -> CausalDecoder:
    return CausalDecoder()


def build_instruction(section: instruction.Options) -> InstructionDecoder:
    return InstructionDecoder(
        section.prompt_column, section.response_column, section.messages_column, section.template
    )


def build_seq2seq(section: seq2seq.Options) -> Seq2SeqPair:
    return Seq2SeqPair(
        section.source_column,
        section.target_column,
        section.max_target_length,
        section.generate_samples,
    )
