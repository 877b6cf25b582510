"""ONNX export with an always-on parity check against PyTorch, and its optional extras.

The folder it writes is self-contained: ``model.onnx`` (inputs ``input_ids`` and
``attention_mask``, and a sentence-pair model's ``token_type_ids`` where it has segment
embeddings, with dynamic batch and sequence axes, output ``logits``, or a task's own:
question answering's ``start_logits`` and ``end_logits``), the tokenizer,
the model config and ``export.json`` (the reports). On request it also holds
``model.opt.onnx`` (ORT graph optimization), ``model.fp16.onnx``, ``model.int8.onnx``,
a decoder's ``model.int4.onnx`` (``ortft.export.int4``) and
``training/`` (on-device training artifacts, built by the caller's ``TrainingStep``); see
``ortft.export.onnx_tools`` and ``ortft.backends.ondevice.artifacts`` for what was measured.

The checks and export.json's pass rules are in ``ortft.export.parity``; a family's own export
(``ortft.tasks.protocols``: ``ExportsGraphs``, or ``ExportsOneGraph`` for one graph on its own
inputs, such as an image classifier's ``pixel_values``; a decoder's graph with its KV cache:
``ExportsDecoder``) in its family package, a bare encoder's too (a task no recipe names:
``ortft.tasks.exporting``); ``onnx/model.onnx``, a link for transformers.js, in
``ortft.export.layout``;
``ortft export SOURCE`` (runs, checkpoints, saved models, ONNX final/) in
``ortft.tools.export_source``.

Everything is written into a staging folder next to OUT and swapped into place at the end
(``parity.publish``, ``fsutil.promote``: an earlier OUT stays whole until then). When a check
fails, the staging folder becomes ``OUT.failed/`` (its export.json says why) and OUT is left
as it was.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from ortft.core.errors import InputError
from ortft.core.reports import ExportReport
from ortft.data import checks
from ortft.export import generation, layout, parity
from ortft.export import onnx_tools as tools
from ortft.export.parity import publish  # the folder: staged, then swapped in
from ortft.export.rows import parity_feeds, samples_source
from ortft.export.rows import tracing_example as _tracing_example
from ortft.tasks import protocols

log = logging.getLogger("ortft")

# Highest opset both torch 2.6's TorchScript exporter (max 20) and ORT 1.19 accept; measured
# for BERT and GPT-2 (14–20 all export, load and match PyTorch). The recipe's default too.
DEFAULT_OPSET = 20
PARITY_SAMPLES = 64


def _task_of(task: str, task_options: Any) -> Any:
    """The task called ``task``, with the run's options (``task_options``) where they are its."""
    from ortft import tasks

    own = task_options is not None and getattr(task_options, "name", None) == task
    return tasks.exporting(task, task_options if own else None)


class _LogitsOnly(torch.nn.Module):
    """The model's logits: the graph's outputs (``split``: a task's own, ``output_names``),
    else as one tensor, the reference parity compares them with."""

    def __init__(
        self, model: torch.nn.Module, is_decoder: bool, spec: Any = None, split: bool = False
    ):
        super().__init__()
        self.model, self.is_decoder, self.split = model, is_decoder, split
        # a task whose model gives no logits (question answering: start and end logits)
        self.output = spec if isinstance(spec, protocols.ReadsOutput) else None

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, ...]:
        kw: dict[str, Any] = {"use_cache": False} if self.is_decoder else {}
        if token_type_ids is not None:  # a sentence-pair model's segments
            kw["token_type_ids"] = token_type_ids
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, return_dict=True, **kw)
        if self.output is not None and self.split:
            return tuple(getattr(out, name) for name in self.output.output_names)
        if self.output is not None:
            return self.output.output_logits(out)
        return out.logits


def output_names(spec: Any) -> tuple[str, ...]:
    """The outputs of ``spec``'s single graph: ``logits``, or a task's own
    (``protocols.ReadsOutput``: question answering's start_logits and end_logits)."""
    return spec.output_names if isinstance(spec, protocols.ReadsOutput) else ("logits",)


def deployable(
    folder: Path,
    task: str,
    tokenizer: Any,
    config: Any,
    result: ExportReport,
    max_length: int | None,
    task_options: Any = None,
    text_pair: tuple[str, str] | None = None,
) -> ExportReport:
    """The export folder made ready for clients (``ortft.export.deploy``): a text model's
    tokenizer without training's padding, the IR version and the runtime checked, the model card
    (``task_options``: the run's ``task:``, e.g. an instruction model's prompt template;
    ``text_pair``: a sentence-pair model's training columns, recorded in export.json)."""
    from ortft.export import deploy

    spec = _task_of(task, task_options)
    if isinstance(spec, protocols.ExportsDecoder):
        result.setdefault("kv_cache", False)  # an ONNX final/ (ort-ondevice) has no cache
        result["genai"] = spec.genai_config(folder, config, result)
    if text_pair is not None:  # ortft predict / eval of this folder alone read pairs
        result["text_pair"] = {"text_column": text_pair[0], "text_pair_column": text_pair[1]}
    result["ir_version"] = deploy.ir_version(folder / next(iter(result["files"].values())))
    result.setdefault("exporter", tools.exporter())
    # a text model's tokenizer loses training's padding; a processor of files has none to lose
    if not isinstance(spec, protocols.ReadsFiles):
        result["tokenizer"] = deploy.clean_tokenizer(folder, deploy.model_limit(config), max_length)
    if checks.needs_labels(spec):
        deploy.label_names(folder, config)
    deploy.write_card(folder, spec, tokenizer, result)
    result["files"]["card"] = "README.md"
    return layout.with_links(folder, result)


def finished(
    folder: Path,
    result: ExportReport,
    feeds: dict[str, np.ndarray],
    tolerance: float,
    options: ExportOptions,
    task: str,
    processor: Any,
    config: Any,
    max_length: int | None = None,
) -> ExportReport:
    """What a family's staged export ends with: the other runtimes checked
    (``other_runtimes``), then the folder made ready for clients (``deployable``)."""
    result = other_runtimes(folder, result, feeds, tolerance, options.check_runtimes)
    return deployable(folder, task, processor, config, result, max_length, options.task_options)


def other_runtimes(
    folder: Path,
    result: ExportReport,
    feeds: dict[str, np.ndarray],
    tolerance: float,
    pythons: Sequence[str],
) -> ExportReport:
    """export.json's ``runtimes``: this build (the checks ran in it), then each other
    onnxruntime of ``--check-runtime`` the export was loaded and run in (only what was checked:
    nothing is claimed for a runtime not run). Before ``deployable``: the card lists them."""
    from ortft.export import deploy

    result["runtimes"] = [deploy.checked_runtime("loaded; parity checked against the reference")]
    for python in pythons:
        result["runtimes"].append(
            deploy.check_runtime(python, folder, result["files"], feeds, tolerance)
        )
    return result


def prediction_positions(task: str) -> str:
    """Which logits are predictions (see ``parity.predictions``): one row per example, or a
    task's per position (``protocols.LogitsPerPosition``); a decoder's are compared on the
    whole sequence (an empty past)."""
    from ortft import tasks

    spec = tasks.exporting(task)  # a bare encoder's export names a task of its own
    return spec.positions if isinstance(spec, protocols.LogitsPerPosition) else "row"


# --------------------------------------------------------------------------- export


class TrainingStep(Protocol):
    """``--training-artifacts``: writes on-device training artifacts into ``art_dir`` and returns
    their report (export.json's ``training``). They are built above this layer
    (``ortft.backends.ondevice.artifacts.ForExport``), so the caller passes the step in."""

    @property
    def tasks(self) -> Sequence[str]: ...  # the tasks it builds for: checked before exporting

    def __call__(
        self,
        model: torch.nn.Module,
        task: str,
        art_dir: Path,
        feeds: dict[str, np.ndarray],
        example: tuple[torch.Tensor, ...],
    ) -> dict[str, Any]: ...


@dataclass(frozen=True)
class ExportOptions:
    """What ``export_model`` writes and checks besides ``model.onnx`` and its parity.

    ``optimize``, ``fp16``, ``quantize`` ("int8", or "int4" for a decoder): also write that
    variant (``parity.wanted``, ``variants``).
    ``training``: also write ``training/`` (``TrainingStep``); None: no training artifacts.
    ``max_length``: the length the model was trained with (recorded with the tokenizer, which
    itself truncates at the model's position limit: see ``ortft.export.deploy``).
    ``kv_cache``: a decoder's graph takes and gives its KV cache (``protocols.ExportsDecoder``);
    False: the graph of the whole sequence (input_ids, attention_mask -> logits).
    ``task_options``: the run's ``task:`` (the model card's example follows it).
    ``check_runtimes``: Pythons with another onnxruntime to load the export in and compare
    (``deploy.check_runtime``); each one checked is added to export.json's ``runtimes``.
    ``text_pair``: a sentence-pair model's training columns (data.text_column,
    data.text_pair_column): export.json records them, parity runs on pairs, and the graph takes
    ``token_type_ids`` where the model uses them (``protocols.ReadsPairs.takes_segments``).
    """

    optimize: bool = False
    fp16: bool = False
    quantize: str | None = None
    training: TrainingStep | None = None
    max_length: int | None = None
    kv_cache: bool = True
    task_options: Any = None
    check_runtimes: Sequence[str] = ()
    pooling: Any = None  # an embedding's pooling (the embedding family's; None: mean, no L2)
    text_pair: tuple[str, str] | None = None


def export_model(
    model: Any,  # a transformers model (torch.nn.Module)
    tokenizer: Any,
    task: str,
    out_dir: Path,
    *,
    opset: int,
    tolerance: float,
    samples: Any = None,
    options: ExportOptions | None = None,
) -> ExportReport:
    """Export ``model`` to ``out_dir``, check it, write export.json; return the report.

    ``samples``: held-out rows to check parity on (else synthetic ones: ``parity_feeds``);
    ``options``: the variants, training artifacts and the rest (``ExportOptions``).
    The report's ``passed`` says whether every check passed (the rules: ``ortft.export.parity``);
    the folder is then ``out_dir``, else ``out_dir.failed`` (``report["dir"]``). Callers turn a
    failure into a GateError.
    """
    options = options or ExportOptions()
    spec = _task_of(task, options.task_options)
    if isinstance(spec, protocols.ExportsGraphs):  # the family's own graphs and checks
        build = spec.export_builder(model, tokenizer, opset, tolerance, samples, options)
        return _published(out_dir, build)
    kinds = variants(spec, task, options)
    training = options.training
    if training is not None and task not in training.tasks:
        raise InputError(
            f"--training-artifacts: built and tested for {', '.join(training.tasks)}, not {task}"
        )
    model = model.eval().to("cpu")
    if isinstance(spec, protocols.ExportsOneGraph):  # the family's inputs and extras
        build = spec.graph_builder(model, tokenizer, opset, tolerance, samples, kinds, options)
    else:
        build = _SingleGraph(
            model, tokenizer, task, opset, tolerance, samples, kinds, options
        ).build
    result = publish(out_dir, build)
    p = result["parity"]
    log.info(
        "exported %s (parity: max |diff| %.2e, agreement %.3f)%s",
        result["dir"],
        p["max_abs_diff"],
        p["prediction_agreement"],
        "" if result["passed"] else f"; FAILED: {'; '.join(result['failures'])}",
    )
    return result


def variants(spec: Any, task: str, options: ExportOptions) -> list[str]:
    """The variants ``options`` ask for (``parity.wanted``); int4 only for a decoder."""
    kinds = parity.wanted(options.optimize, options.fp16, options.quantize)
    if "int4" in kinds and not isinstance(spec, protocols.ExportsDecoder):
        raise InputError(
            f"--quantize int4 is weight-only int4 for decoders (causal-lm, instruction), not "
            f"{task}: use --quantize int8"
        )
    return kinds


class _SingleGraph:
    """One ``model.onnx`` (with its variants and extras): ``build`` fills the staging folder;
    a decoder's (``protocols.ExportsDecoder``) with its KV cache unless options.kv_cache is off."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        task: str,
        opset: int,
        tolerance: float,
        samples: Any,
        kinds: list[str],
        options: ExportOptions,
    ):
        self.model, self.tokenizer, self.task = model, tokenizer, task
        self.opset, self.tolerance, self.samples = opset, tolerance, samples
        self.kinds, self.options = kinds, options
        spec = _task_of(task, options.task_options)
        self.decoder = spec if isinstance(spec, protocols.ExportsDecoder) else None
        self.cache = self.decoder if options.kv_cache else None
        self.spec = spec
        # the reference logits
        self.wrapper = _LogitsOnly(model, self.decoder is not None, spec).eval()
        # a sentence-pair model with segment embeddings takes its token_type_ids too
        segments = (
            options.text_pair is not None
            and isinstance(spec, protocols.ReadsPairs)
            and spec.takes_segments(model, tokenizer)
        )
        self.names = ("input_ids", "attention_mask", *(("token_type_ids",) if segments else ()))
        self.feeds = parity_feeds(samples, tokenizer, PARITY_SAMPLES, segments)
        self.example = _tracing_example(self.feeds, tokenizer, self.names)

    def build(self, tmp: Path) -> ExportReport:
        model, task, feeds, o = self.model, self.task, self.feeds, self.options
        graph = _graph(model, self.spec, self.example, self.names, self.decoder, self.cache)
        export_s = _torch_export(graph, tmp / "model.onnx", self.opset)
        with torch.no_grad():
            want = self.wrapper(*(torch.from_numpy(feeds[k]) for k in self.names))
        source = samples_source(self.samples)
        positions = prediction_positions(task)
        outputs = output_names(self.spec)  # a decoder's graph gives its cache too
        ref = parity.Reference(
            feeds, want.numpy(), positions, self.tolerance, source, self.names, outputs
        )
        self.tokenizer.save_pretrained(tmp)
        generation.save(model, tmp)  # config.json, generation_config.json
        result = parity.build_report(
            tmp,
            ref,
            task=task,
            model_type=getattr(model.config, "model_type", None),
            opset=self.opset,
            kinds=self.kinds,
            export_s=export_s,
        )
        result["inputs"], result["outputs"] = graph.inputs, graph.outputs
        if self.decoder is not None:
            result["kv_cache"] = self.cache is not None
        if self.cache is not None:  # the cache over several steps, against PyTorch's generate
            result["generation"] = self.cache.generation_check(
                model, tmp / "model.onnx", feeds, self.tolerance
            )
        if self.decoder is not None and "int4" in self.kinds:  # its generations against fp32
            result["int4"]["quality"] = self.decoder.quantized_check(
                model, tmp / "model.onnx", tmp / "model.int4.onnx", feeds, self.cache is not None
            )
        if o.training is not None:
            result["training"] = o.training(model, task, tmp / "training", feeds, self.example)
            result["files"]["training"] = "training/"
        result = other_runtimes(tmp, result, feeds, self.tolerance, o.check_runtimes)
        recorded = (o.max_length, o.task_options, o.text_pair)  # the card, export.json
        return deployable(tmp, task, self.tokenizer, model.config, result, *recorded)


@dataclass
class Graph:
    """What torch.onnx.export traces: the module, its example inputs, names and dynamic axes."""

    module: torch.nn.Module
    example: tuple[torch.Tensor, ...]
    inputs: list[str]
    outputs: list[str]
    axes: dict[str, dict[int, str]]


def _graph(
    model: Any,
    spec: Any,
    example: tuple[torch.Tensor, ...],
    names: tuple[str, ...],
    decoder: Any,
    cache: Any,
) -> Graph:
    """The graph of ``model.onnx``: ``spec``'s logits only (of the inputs ``names``, in
    ``example``'s order; ``decoder``: called without its cache), or a decoder with its KV cache
    (``cache``: the ``protocols.ExportsDecoder`` that builds it)."""
    if cache is not None:
        return cache.cached_graph(model, example)
    axes = {k: {0: "batch", 1: "sequence"} for k in names}
    outputs = output_names(spec)
    per_position = isinstance(spec, protocols.LogitsPerPosition) or outputs != ("logits",)
    for name in outputs:  # a task's own outputs are per position (start and end logits)
        axes[name] = {0: "batch", 1: "sequence"} if per_position else {0: "batch"}
    # eval() on the wrapper itself: torch.onnx.export restores the wrapper's own mode after
    # exporting, and a wrapper left in training mode would switch dropout back on.
    module = _LogitsOnly(model, decoder is not None, spec, split=True).eval()
    return Graph(module, example, list(names), list(outputs), axes)


def _published(out_dir: Path, build: Callable[[Path], ExportReport]) -> ExportReport:
    """``publish`` the staged export and log its parity line."""
    result = publish(out_dir, build)
    log.info(
        "exported %s (parity: max |diff| %.2e)%s",
        result["dir"],
        result["parity"]["max_abs_diff"],
        "" if result["passed"] else f"; FAILED: {'; '.join(result['failures'])}",
    )
    return result


def _torch_export(graph: Graph, path: Path, opset: int) -> float:
    """``tools.torch_export`` of ``graph``; its seconds."""
    return tools.torch_export(
        graph.module, graph.example, path, opset, graph.inputs, graph.outputs, graph.axes
    )
