"""What the core calls on a task family beyond the ``Task`` base: small protocols a family's
task implements when it needs them, checked with ``isinstance`` where the core would otherwise
branch on the family's name.

A family package (``ortft/families/<family>/``) sits above the core and is reached only through
the task registry (``ortft.tasks.BUILTIN``); the engine, the exporter, eval and predict hold the
family's ``Task`` and ask it through these protocols. Each method imports its framework
lazily, so building a task for ``ortft validate`` stays free of torch.

Over 450 lines: one small protocol per hook, each with its docstring; split up, what the core
may ask of a family would no longer be read in one place.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from ortft.core.reports import Drawing, EvalResult, ExportReport, Prediction, Section

if TYPE_CHECKING:
    from ortft.tasks.base import Task

# A staged export's builder: fills the staging folder, returns the export's report
# (``ortft.export.parity.publish`` swaps the folder in).
Builder = Callable[[Path], ExportReport]
# A transformers.js pipeline call: (the pipeline, its arguments, its options)
JsCall = tuple[str, list[Any], dict[str, Any]]


@runtime_checkable
class ChecksRecipe(Protocol):
    """A family with recipe rules of its own (what model.tokenizer may say, for example)."""

    def recipe_problems(self, recipe: Any) -> Iterator[str]:
        """One line per problem of ``recipe`` (a validated ``Recipe``), naming the field."""
        ...


@runtime_checkable
class LoadsProcessor(Protocol):
    """A family whose rows are files: the run loads its processor where a text task loads a
    tokenizer, and binds it to the task (``Task.bind``) for ``collate``."""

    def load_processor(self, loaded: Any, source: str | None, saved: Path | None, rows: Any) -> Any:
        """Training's processor: the saved one (``saved``: a resumed run's), the model's own
        (``source``), or one built for a from_config model (``rows``: the training rows)."""
        ...

    def processor_from_folder(self, folder: Path, field: str = "model") -> Any:
        """A trained model folder's processor (eval, predict, ``ortft export``); ``field``
        names the folder in a one-line error."""
        ...


@runtime_checkable
class ExportsGraphs(Protocol):
    """A family whose export is its own set of graphs, runners and checks."""

    def export_builder(
        self, model: Any, processor: Any, opset: int, tolerance: float, samples: Any, options: Any
    ) -> Builder:
        """The staging folder's builder (``options``: the exporter's ``ExportOptions``)."""
        ...


@runtime_checkable
class OwnRunner(Protocol):
    """A family whose saved model eval and predict run through the family's own code: the
    logits of its batches, and a runner over its export (which generates, as PyTorch does)."""

    def open_export(self, folder: Path, config: Any) -> Any:
        """The runner over the export in ``folder`` (``config``: the model's config), or None
        where ``folder`` holds a single graph the plain ONNX session runs."""
        ...

    def batch_logits(self, model: Any, runtime: str, batch: dict[str, np.ndarray]) -> np.ndarray:
        """The logits of one collated eval batch, on the PyTorch model or the runner."""
        ...


@runtime_checkable
class DescribesExport(Protocol):
    """A family whose export's model card (README.md) shows its own code."""

    def card(self, report: ExportReport) -> tuple[str, str, str, str]:
        """(code, what the folder holds, the inputs, usage) for the export's README."""
        ...


@runtime_checkable
class PredictsFiles(Protocol):
    """A family whose ``ortft predict`` reads files, not text lines."""

    def predict_files(
        self, model: Any, input_path: str, batch_size: int, max_new_tokens: int
    ) -> Iterator[Prediction]:
        """One result per input file (``model``: the opened ``SavedModel``)."""
        ...


# Hooks a few tasks need beside the ``Task`` base (each names who implements it)


@runtime_checkable
class ReadsFiles(Protocol):
    """A task whose ``collate`` decodes files with the run's processor (images, audio, a
    Stable Diffusion's captioned images): it keeps what ``bind`` hands it."""

    def bind(self, processor: Any) -> None:
        """The run's loaded tokenizer or processor (once, before any batch)."""
        ...


@runtime_checkable
class ReportsData(Protocol):
    """A task that counts what reading its files took (files skipped, converted)."""

    def data_report(self, splits: dict[str, tuple[Any, Any]]) -> dict[str, Any]:
        """What summary.json's ``data`` adds, from each split's (rows, encoded)."""
        ...


@runtime_checkable
class TrainsState(Protocol):
    """A task that keeps training state besides the model (text-to-image's EMA weights)."""

    def after_step(self) -> None:
        """After each applied optimizer step."""
        ...

    def state_dict(self) -> dict[str, Any] | None:
        """What a checkpoint keeps of the task (``task_state.pt``)."""
        ...

    def load_state_dict(self, state: dict[str, Any] | None, path: Path) -> None:
        """``state_dict()`` as checkpoint ``path`` kept it (None: it kept none)."""
        ...


@runtime_checkable
class ReadsPairs(Protocol):
    """A task that may read a text pair per row (sequence classification)."""

    def pair_columns(self, data: Any) -> tuple[str, str] | None:
        """(first, second) text column when ``data`` names a pair: the export records them,
        and predict and eval then need both texts; None for single texts."""
        ...

    def takes_segments(self, model: Any, tokenizer: Any) -> bool:
        """Whether a pair's ``token_type_ids`` reach ``model`` (the graph takes them too)."""
        ...


@runtime_checkable
class ShapesEval(Protocol):
    """A task whose eval reads more than logits and labels (question answering: the padding
    masked, the context its answers are read from)."""

    def eval_logits(self, logits: np.ndarray, batch: dict[str, np.ndarray]) -> np.ndarray:
        """A saved model's logits as training's ``forward`` returns them."""
        ...

    def metric_labels(self, batch: dict[str, np.ndarray], valid: int) -> Any:
        """What ``metrics`` gets for one eval batch's first ``valid`` rows."""
        ...


@runtime_checkable
class ReadsLabelNames(Protocol):
    """A task whose metrics read a saved model's label names (token classification)."""

    def bind_labels(self, names: list[str]) -> None:
        """The label names in id order (``ortft eval`` reads them from config.json)."""
        ...


@runtime_checkable
class PreparesModel(Protocol):
    """A task that sets up the built model before it is wrapped (sequence classification's
    pad token, sentence embedding's pooling, speech's generation config)."""

    def prepare_model(self, model: Any, processor: Any) -> None: ...


@runtime_checkable
class ComposesConfig(Protocol):
    """A task whose ``from_config`` model has a config of several parts that the family puts
    together (vision-language: a vision tower's config, the language model's from
    ``model.from_config``'s sizes and the tokenizer, and the projector between them)."""

    def model_config(self, spec: Any, tokenizer: Any, dropout: float | None) -> Any: ...


@runtime_checkable
class RunsOutside(Protocol):
    """A task part of whose forward runs before the wrapped module, eagerly and without
    gradients (vision-language: the frozen vision tower turns ``pixel_values`` into image
    features, so ORTModule's graph is the projector and the language model; causal LMs: the
    positions their head runs at, ``ortft.tasks.lm_head``). ``outside_inputs`` maps the
    batch's tensors to the module's."""

    def outside_inputs(self, inputs: dict[str, Any]) -> dict[str, Any]: ...


@runtime_checkable
class AdaptsLanguageModel(Protocol):
    """A task whose LoRA adapts part of the model only (vision-language: the language model's
    projections, not the vision tower's of the same name) and trains a few modules in full
    (the projector): ``adapter_targets`` turns ``adapter.target_modules`` (or the default of
    the language model's type) into peft's ``target_modules`` and ``modules_to_save``."""

    def adapter_targets(self, model: Any, targets: list[str] | None) -> tuple[Any, list[str]]: ...


@runtime_checkable
class ScoresOutside(Protocol):
    """A task whose loss is not the wrapped module's (preference: DPO from the chosen and
    rejected sequences' log-probs). The module takes ``module_inputs(batch)`` and returns what
    the task's ``forward`` gives (the model's own graph under ORTModule); ``outside_loss``
    turns that and the batch into (the loss, the eval's per-row scores for ``metrics``)."""

    def module_inputs(self, batch: dict[str, Any]) -> dict[str, Any]: ...

    def outside_loss(self, output: Any, batch: dict[str, Any]) -> tuple[Any, Any]: ...


@runtime_checkable
class ScoresReference(Protocol):
    """A task whose loss compares the model with a reference on the same rows (preference: the
    reference log-probs of DPO and IPO). Before the model is built it takes the encoded splits
    and gives them back with the reference's columns, which it fills in ``prepare_model``
    (``PreparesModel``) from the freshly built model, its batches padded as ``data`` pads
    training's."""

    def with_reference(self, train: Any, evals: Any, data: Any) -> tuple[Any, Any]: ...


@runtime_checkable
class EvaluatesSaved(Protocol):
    """A task whose ``ortft eval`` metrics are not the logits' cross-entropy (preference: each
    pair's rewards against the reference): it scores the encoded rows on the opened model
    (``ortft.inference.evaluate.SavedModel``), given the run's recipe when there is one."""

    def evaluate_saved(
        self, model: Any, encoded: Any, loaded: Any, batch_size: int
    ) -> dict[str, float]: ...


@runtime_checkable
class WritesExtras(Protocol):
    """A task whose ``final/`` holds files beside the model's own (sentence embedding: the
    sentence-transformers modules.json and pooling config)."""

    def write_extras(self, folder: Path, model: Any) -> None: ...


@runtime_checkable
class GeneratesMetrics(Protocol):
    """A task whose eval generates (seq2seq, speech): metrics beyond the logits."""

    def generate_metrics(self, model: Any, tokenizer: Any, encoded: Any) -> dict[str, float]:
        """On the plain model (PyTorch, or an export's runner that generates)."""
        ...


def generated_metrics(task: Any, model: Any, tokenizer: Any, encoded: Any) -> dict[str, float]:
    """A task's generate metrics (``GeneratesMetrics``); {} for one that does not generate."""
    if isinstance(task, GeneratesMetrics):
        return task.generate_metrics(model, tokenizer, encoded)
    return {}


def pairs_of(task: Any, data: Any) -> tuple[str, str] | None:
    """A pair model's (first, second) text columns in ``data`` (``ReadsPairs``); None."""
    return task.pair_columns(data) if isinstance(task, ReadsPairs) else None


def metric_labels(task: Any, batch: dict[str, np.ndarray], valid: int) -> Any:
    """What a task's ``metrics`` gets for an eval batch: its own (``ShapesEval``) or the
    labels of the first ``valid`` rows."""
    if isinstance(task, ShapesEval):
        return task.metric_labels(batch, valid)
    return batch["labels"][:valid]


# the text family's hooks


@runtime_checkable
class ReadsOutput(Protocol):
    """A task whose model gives no ``logits`` (question answering: start and end logits)."""

    def output_logits(self, out: Any) -> Any:
        """``out`` (the model's output) as the one tensor the loss, parity and eval read: its
        ``output_names`` fields stacked on axis 1."""
        ...

    @property
    def output_names(self) -> tuple[str, ...]:
        """The export's outputs, each [batch, sequence]: the model output's fields of these
        names, as Optimum's exports and transformers.js name them (``start_logits``,
        ``end_logits``); ``ortft.export.parity.graph_logits`` stacks them back."""
        ...


@runtime_checkable
class LogitsPerPosition(Protocol):
    """A task whose single graph gives logits per input position, where the default is one
    row per example: ``logits`` keeps its sequence axis, parity compares at ``positions``."""

    @property
    def positions(self) -> str:
        """``ortft.export.parity.predictions``' "token" (token classification, masked LM) or
        "next-token" (generation's decoders)."""
        ...


@runtime_checkable
class ReadsFields(Protocol):
    """A task whose ``ortft predict`` input is a JSON line of its own fields, not one text
    (question answering: the question and the context)."""

    def example_input(self) -> dict[str, str]:
        """The model card's example as such a line (what the consumer test feeds)."""
        ...


# vision's hooks


@runtime_checkable
class ExportsOneGraph(Protocol):
    """A family whose export is one ``model.onnx`` on its own inputs, with its extras beside it,
    under the exporter's single-graph rules (where ``ExportsGraphs`` hands a family the whole
    export): the variants (``--optimize``, ``--fp16``, ``--quantize``), ``--training-artifacts``
    refused for a task not measured on device, and the parity line with the agreement."""

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
        """The staging folder's builder (``model``: on the CPU, in eval mode; ``kinds``: the
        variants asked for; ``options``: the exporter's ``ExportOptions``)."""


# text-to-image's hooks


@runtime_checkable
class LoadsTokenizer(Protocol):
    """A family whose tokenizer comes from its own model folder layout (or is made for a
    from_config model), not from transformers' ``AutoTokenizer``."""

    def load_tokenizer(self, loaded: Any, run_dir: Path) -> Any:
        """The run's tokenizer (``loaded``: the ``LoadedRecipe``); rank 0 saves it in
        ``run_dir``, the other ranks load that copy."""
        ...


@runtime_checkable
class BuildsModel(Protocol):
    """A family that builds its own model, not one of a transformers auto class."""

    def model_problems(self, recipe: Any) -> Iterator[str]:
        """One line per problem of what ``recipe`` asks of the model it builds (its
        from_config, the backend, the adapter), naming the field."""
        ...

    def build_model(self, loaded: Any, tokenizer: Any, device: Any) -> Any:
        """The module that trains, on the run's ``device``; the family keeps the rest."""
        ...


@runtime_checkable
class SavesFinal(Protocol):
    """A family whose final/ is a folder of its own layout, not ``save_pretrained``'s."""

    def save_final(self, folder: Path, model: Any) -> None:
        """The trained ``model`` (what ``build_model`` gave) and its parts into ``folder``."""
        ...


@runtime_checkable
class DrawsValidation(Protocol):
    """A family that draws as it trains: every ``validation_every`` steps and at the last, the
    loop asks it for its validation images."""

    @property
    def validation_every(self) -> int | None:
        """Steps between the drawings (None: it draws none)."""
        ...

    def draw_validation(self, folder: Path, seed: int) -> int:
        """Its images drawn into ``folder`` with the weights as they are now (``seed``:
        ``training.seed``); how many (0 where this process draws none)."""
        ...


@runtime_checkable
class OwnsFolders(Protocol):
    """A family whose saved model is a folder of its own layout (no config.json): eval, predict
    and ``ortft export`` know one by its folder (``ortft.tasks.folder_family``) and hand it over;
    its final/ is exported from that folder."""

    def owns_folder(self, folder: Path) -> bool:
        """Whether ``folder`` itself holds one of the family's saved models."""
        ...

    def open_problem(self, source: Path) -> str:
        """Why eval's and predict's ``open_model`` does not open ``source`` (one of the
        family's): the commands that do."""
        ...

    def evaluate_folder(self, source: Path, data_file: Path | None, batch_size: int) -> EvalResult:
        """``ortft eval`` of ``source`` (a run, a model folder or its export): the result that
        ``ortft.inference.evaluate.format_result`` prints."""
        ...

    def export_folder(
        self,
        folder: Path,
        out_dir: Path,
        opset: int,
        tolerance: float,
        weights: Path | None = None,
        flags: Sequence[str] = (),
    ) -> ExportReport:
        """The export of ``folder`` into ``out_dir`` and its report; ``ortft export`` also
        passes ``weights`` (a checkpoint's folder, else ``folder``) and the ``flags`` it was
        given, which the family refuses in one line where it cannot honour them."""
        ...


@runtime_checkable
class DrawsPrompts(Protocol):
    """A family whose models draw a prompt into an image (``ortft predict --prompt -o``)."""

    def draw(self, source: Path, options: dict[str, Any], output: Path) -> Drawing:
        """One image of ``options["prompt"]`` drawn with ``source`` into ``output``; what was
        drawn (``options``: the command's drawing options, by name)."""
        ...


# generation's hooks


@runtime_checkable
class ExportsDecoder(Protocol):
    """A decoder under the exporter's single-graph rules: its graph is called with
    ``use_cache=False``, or takes and gives its KV cache (``ExportOptions.kv_cache``);
    export.json's ``kv_cache`` says which (false for an ONNX final/, which has none)."""

    def cached_graph(self, model: Any, example: tuple[Any, ...]) -> Any:
        """The graph with its cache (an ``ortft.export.exporter.Graph``), traced from the plain
        graph's ``example`` (input_ids, attention_mask)."""
        ...

    def generation_check(
        self, model: Any, path: Path, feeds: dict[str, np.ndarray], tolerance: float
    ) -> dict[str, Any]:
        """export.json's ``generation``: the graph with its cache (``path``) generating as
        PyTorch's ``generate`` does, on prompts from the parity ``feeds``."""
        ...

    def genai_config(self, folder: Path, config: Any, report: ExportReport) -> Section:
        """Writes onnxruntime-genai's config into the export's ``folder`` where genai runs the
        graph as written (the model's ``config``, export.json's ``report`` so far); returns
        export.json's ``genai``: what was written, or why not."""
        ...

    def quantized_check(
        self, model: Any, fp32: Path, variant: Path, feeds: dict[str, np.ndarray], cache: bool
    ) -> dict[str, Any]:
        """export.json's ``int4.quality`` (``--quantize int4``, decoders only): the weight-only
        int4 file (``variant``) against the fp32 one: greedy generations on prompts from the
        parity ``feeds`` and the teacher-forced perplexity on them (``cache``: the graphs take
        their KV cache)."""
        ...


@runtime_checkable
class PredictsLines(Protocol):
    """A family whose ``ortft predict`` answers each input line itself (generation: the text
    ``generate`` gives, on PyTorch or the export)."""

    def predict_lines(
        self,
        model: Any,
        inputs: list[tuple[str, dict[str, Any]]],
        max_new_tokens: int,
        max_length: int | None,
        batch_size: int,
    ) -> Iterator[Prediction]:
        """One result per input (``inputs``: where each line is and its object, as
        ``ortft.inference.predict.read_inputs`` gives them; ``model``: the opened
        ``SavedModel``; ``max_length``: the command's, None where it gave none)."""
        ...


@runtime_checkable
class WritesSnippet(Protocol):
    """A text family whose export's model card runs code of its own on the tokenizer's ids
    (generation: a decoder's loop with or without its KV cache, a seq2seq pair's), under the
    tokenizer line every text export's card has."""

    def snippet(self, tokenizer: Any, report: ExportReport) -> str:
        """The card's code (``report``: export.json's sections)."""
        ...


@runtime_checkable
class OpensInTransformersJs(Protocol):
    """A family whose export a transformers.js pipeline opens as ortft writes it: its model card
    shows the call (``ortft.export.js_card``), which the consumer tier runs."""

    def js_call(self, tokenizer: Any, report: ExportReport) -> JsCall | None:
        """(the pipeline, the card example's arguments, the call's options); None where the
        pipeline cannot read this export as ortft does (a text pair, max pooling)."""
        ...


# embedding's hooks


@runtime_checkable
class EmbedsTexts(Protocol):
    """A family whose models embed texts: eval and predict hand it a folder that embeds (a run,
    a model folder, an ONNX export) before ``open_model`` reads a task from it, since an export
    of a plain encoder names none (``ortft.tasks.embedder`` asks every registered task)."""

    def embeds(self, source: Path) -> bool:
        """Whether ``source`` (a run dir, a model folder or an ONNX export) gives embeddings."""
        ...

    def evaluate_embeddings(
        self, source: Path, data_file: Path | None, batch_size: int
    ) -> EvalResult:
        """``ortft eval`` of ``source``: the result that
        ``ortft.inference.evaluate.format_result`` prints."""
        ...

    def predict_embeddings(
        self,
        source: Path,
        texts: list[str],
        where: str,
        *,
        query: str | None,
        top_k: int | None,
        max_length: int | None,
        batch_size: int,
    ) -> Iterator[Prediction]:
        """``ortft predict`` of ``source`` on ``texts`` (``where``: the input's name): one
        embedding per text, or with ``query`` the texts ranked by similarity to it (``top_k``:
        the first N); ``max_length``: None, the folder's own."""
        ...


@runtime_checkable
class ExportsPlainEncoders(Protocol):
    """A family that also exports a text encoder without a task head that no recipe describes
    (``BertModel``, a sentence-transformers folder): ``ortft export`` finds it by the folder's
    config (``ortft.tasks.plain_encoder``) and exports the folder as ``plain_task``, a task no
    recipe names; the exporter finds that task by its name (``ortft.tasks.exporting``)."""

    def plain_encoder(self, config: Any) -> bool:
        """Whether ``config`` (a saved model's) is such an encoder."""
        ...

    def plain_task(self) -> Task:
        """The task the export is written as: its name is export.json's task."""
        ...

    def plain_options(self, folder: Path) -> dict[str, Any]:
        """What the export of ``folder`` adds to the exporter's ``ExportOptions``."""
        ...
