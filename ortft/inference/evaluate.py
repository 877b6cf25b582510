"""``ortft eval``: score a saved model on a dataset with the metrics training reports.

The model is a run directory (its ``final/``), a saved Hugging Face model directory, or an
ONNX export folder (``model.onnx``, or a seq2seq's ``encoder_model.onnx`` +
``decoder_model_merged.onnx``, with the tokenizer and config; an image export: ``model.onnx``
with the image processor's ``preprocessor_config.json``), which runs in an onnxruntime ``InferenceSession``. Both kinds go
through the same code: the model gives logits, and the loss and metrics are computed from them
here, so a PyTorch model and its ONNX export report the same numbers (to float rounding).
Batches get the task's fixed eval variant first, as in training's eval (masked-lm: the eval
masking, seeded by the recipe's training.seed). A seq2seq model (PyTorch, or its export's
encoder + decoder graphs) gets its logits from the decoder fed the target, and its generate
metrics (exact match, token F1) as in training. An image model (image-classification) gets its
batches as training's eval does: each file decoded, then the image processor
(``preprocessor_config.json``, PIL backend) gives the ``pixel_values`` both runtimes are fed
(an export's ``model.onnx`` too; ``preprocess.onnx`` is what ``ortft predict`` runs); accuracy,
macro-F1, top-5 accuracy (more than 5 classes) and the loss come from the logits. A family
with its own runner (``ortft.tasks.protocols.OwnRunner``) gives its batches' logits and opens
its export itself; its generate metrics run there as on PyTorch.
The default data is the eval split the run's recipe used (``final/recipe.yaml``); ``--data``
scores another file in any format ``ortft.data.rows`` reads (images: a folder of class
sub-folders, or a csv/jsonl whose ``image`` column names files relative to it).
The task is the run's own (its recipe's ``task:``, or the one an ONNX folder's export.json
records), so an instruction run is scored as instruction; only a plain Hugging Face model that
no ortft run describes has its task guessed from its architecture name.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ortft import tasks
from ortft.core.constants import IGNORE_INDEX
from ortft.core.errors import InputError, RecipeError
from ortft.core.reports import EvalResult
from ortft.data import checks, splits
from ortft.data import rows as data_mod
from ortft.data.spec import DataSection
from ortft.export import deploy
from ortft.inference import pairs
from ortft.recipe.io import LoadedRecipe
from ortft.recipe.schema import Recipe, TrainingSection
from ortft.recipe.task import read_task
from ortft.run.summary import RunSummary
from ortft.tasks import protocols, traits

log = logging.getLogger("ortft")


@dataclass
class SavedModel:
    """A trained model ready to give logits, with what is known about how it was trained."""

    runtime: str  # "pytorch" or "onnxruntime"
    path: Path  # the model directory or the ONNX folder
    task: str
    config: Any
    tokenizer: Any  # an image task's: its image processor (as training's engine.tokenizer gives)
    recipe_yaml: Path | None  # the recipe it was trained with, when it is known
    run_dir: Path | None
    _model: Any = None
    spec: Any = None  # the task itself (tasks.Task), built with the run's task options
    # a sentence-pair model's training text columns (``ortft.inference.pairs``); None: one text
    text_pair: tuple[str, str] | None = None

    def logits(
        self,
        input_ids: np.ndarray,
        attention_mask: np.ndarray,
        labels: np.ndarray | None = None,
        token_type_ids: np.ndarray | None = None,
    ) -> np.ndarray:
        """The model's logits (``labels``: unused here; a family whose decoder reads them gives
        its own: ``protocols.OwnRunner``); ``token_type_ids``: a text pair's, fed where the
        model takes them, as in training."""
        types = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
        if self.runtime == "onnxruntime":
            from ortft.export.parity import graph_logits

            feeds = {"input_ids": input_ids, "attention_mask": attention_mask, **types}
            feeds = {k: v.astype(np.int64) for k, v in feeds.items()}
            own = isinstance(self.spec, protocols.ReadsOutput)  # question answering: two outputs
            outputs = self.spec.output_names if own else ("logits",)
            return graph_logits(self._model, feeds, outputs, str(self.path / "model.onnx"))
        import torch

        kw: dict[str, Any] = {"use_cache": False} if traits.decodes(self.spec) else {}
        pair = isinstance(self.spec, protocols.ReadsPairs)
        if types and pair and self.spec.takes_segments(self._model, self.tokenizer):
            kw["token_type_ids"] = torch.from_numpy(types["token_type_ids"].astype(np.int64))
        with torch.no_grad():
            out = self._model(
                input_ids=torch.from_numpy(input_ids),
                attention_mask=torch.from_numpy(attention_mask),
                return_dict=True,
                **kw,
            )
        if isinstance(self.spec, protocols.ReadsOutput):  # question answering: as its export's
            return self.spec.output_logits(out).float().numpy()
        return out.logits.float().numpy()

    def batch_logits(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        """The logits of one collated eval batch (its pixel_values, features or tokens)."""
        if isinstance(self.spec, protocols.OwnRunner):
            return self.spec.batch_logits(self._model, self.runtime, batch)
        ids, mask = batch["input_ids"], batch["attention_mask"]
        return self.logits(ids, mask, batch["labels"], batch.get("token_type_ids"))

    def labels(self) -> list[str] | None:
        if not checks.needs_labels(self.spec):
            return None
        id2label = self.config.id2label
        return [str(id2label[i]) for i in range(len(id2label))]

    def max_positions(self) -> int | None:
        return deploy.model_limit(self.config)


def _task(source: Path, recipe_yaml: Path | None, config: Any) -> tasks.Task:
    """The task the model was trained for: its recipe's ``task:`` (with its options), else the
    task its ONNX export recorded (export.json). A plain Hugging Face model that no ortft run
    describes is the only case left to the architecture name (e.g. *ForCausalLM: causal-lm)."""
    options = read_task(recipe_yaml) if recipe_yaml is not None else None
    if options is not None:
        return tasks.get(options.name, options)
    try:
        recorded = json.loads((source / "export.json").read_text()).get("task")
    except (OSError, ValueError, AttributeError):
        recorded = None
    if recorded in tasks.names():
        return tasks.get(recorded)
    return tasks.get(tasks.from_architecture(config))  # fallback: no ortft recipe or export


def _preprocessor(source: Path, task: tasks.Task) -> Any:
    """The model's tokenizer, or the processor of a task whose rows are files (the family's
    own: an image task's image processor, its PIL backend as in training), bound to the task:
    its ``collate`` decodes the files and runs it."""
    if isinstance(task, protocols.LoadsProcessor):
        processor = task.processor_from_folder(source)
        if isinstance(task, protocols.ReadsFiles):
            task.bind(processor)
        return processor
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as err:
        raise InputError(f"{source}: cannot load config/tokenizer ({err})") from None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def open_model(source: Path) -> SavedModel:
    """A run dir (its final/), a saved HF model dir, or an ONNX export folder."""
    from transformers import AutoConfig
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # stdout/stderr stay ortft's
    source = Path(source)
    if not source.is_dir():
        raise InputError(
            f"{source}: not a directory (give a run dir, a model dir or an ONNX folder)"
        )
    family = tasks.folder_family(source, source / "final")
    if family is not None:  # a folder of a family's own layout: its own commands read it
        raise InputError(family.open_problem(source))
    run_dir = None
    if (source / "final" / "config.json").exists():
        run_dir, source = source, source / "final"
    elif (source.parent / "summary.json").exists():
        run_dir = source.parent  # <run>/final or <run>/onnx
    onnx_file = source / "model.onnx"
    for encoder in ("encoder_model.onnx", "encoder.onnx"):  # an encoder-decoder's (older) export
        if (source / encoder).exists():
            onnx_file = source / encoder
    if not onnx_file.exists() and not (source / "config.json").exists():
        raise InputError(
            f"{source}: no final/, config.json or model.onnx here "
            "(give a run dir, a saved Hugging Face model or an ONNX export folder)"
        )
    try:
        config = AutoConfig.from_pretrained(source)
    except (OSError, ValueError) as err:
        raise InputError(f"{source}: cannot load config.json ({err})") from None
    recipe_yaml = next(
        (
            p
            for p in (
                source / "recipe.yaml",
                run_dir / "final" / "recipe.yaml" if run_dir else None,
            )
            if p is not None and p.exists()
        ),
        None,
    )
    task = _task(source, recipe_yaml, config)
    tokenizer = _preprocessor(source, task)
    text_pair = pairs.columns(source, recipe_yaml, task)
    # the model's label names, in id order (token classification's metrics read them)
    if checks.needs_labels(task) and isinstance(task, protocols.ReadsLabelNames):
        task.bind_labels([str(config.id2label[i]) for i in range(len(config.id2label))])
    common = dict(
        path=source,
        task=task.name,
        config=config,
        tokenizer=tokenizer,
        recipe_yaml=recipe_yaml,
        run_dir=run_dir,
        spec=task,
        text_pair=text_pair,
    )
    runner = task.open_export(source, config) if isinstance(task, protocols.OwnRunner) else None
    if runner is not None:
        return SavedModel(runtime="onnxruntime", _model=runner, **common)
    if onnx_file.exists():
        import onnxruntime as ort

        session = ort.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
        return SavedModel(runtime="onnxruntime", _model=session, **common)
    import transformers

    model = getattr(transformers, task.auto_class).from_pretrained(source).eval()
    return SavedModel(runtime="pytorch", _model=model, **common)


def training_recipe(m: SavedModel) -> LoadedRecipe | None:
    """The recipe the model was trained with; relative paths resolve against its original folder."""
    from ortft.recipe import io as recipe_io

    if m.recipe_yaml is None:
        return None
    try:
        # (a recipe dumped by older ortft lists every task's options: the task field drops the
        # other tasks' defaults, so it validates as it is)
        loaded = recipe_io.load(m.recipe_yaml, check_files=False)
    except RecipeError as err:
        log.warning("ignoring %s: %s", m.recipe_yaml, err)
        return None
    base = Path.cwd()
    summary = (m.run_dir / "summary.json") if m.run_dir else None
    if summary is not None and summary.exists():
        recorded = RunSummary.from_dict(json.loads(summary.read_text())).paths.recipe
        if recorded:
            base = Path(recorded).parent
    return dataclasses.replace(loaded, base_dir=base)


def load_rows(
    m: SavedModel, data_file: Path | None, loaded: LoadedRecipe | None
) -> tuple[list[dict[str, Any]], Any, str]:
    """(rows, the data section to encode them with, a description of where they came from);
    ``loaded``: the model's training recipe, when known."""
    task = m.spec
    if data_file is None:
        if loaded is None:
            raise InputError(
                f"{m.path}: no recipe.yaml tells which eval data it was trained "
                "with; pass --data FILE"
            )
        spec, seed = loaded.recipe.data, loaded.recipe.training.seed
        split = splits.load_splits(spec, loaded.base_dir, task, seed=seed).eval
        rows = list(split) if split is not None else []
        if not rows:
            raise InputError(f"{m.recipe_yaml}: the recipe has no eval data; pass --data FILE")
        return rows, loaded.recipe.data, f"the eval split of {m.recipe_yaml}"
    if loaded is None:  # no recipe: the data section's defaults (text/label columns, 128 tokens)
        data: dict[str, Any] = {"train": str(data_file)}
        limit = m.max_positions()
        if limit is not None and limit < DataSection.model_fields["max_length"].default:
            data["max_length"] = limit  # rows padded past the model's positions would not run
        recipe = Recipe.model_validate(
            {"model": {"name_or_path": str(m.path)}, "task": m.spec.name, "data": data}
        )
        loaded = LoadedRecipe(recipe=recipe, path=None, base_dir=Path.cwd(), raw={})
    spec = loaded.recipe.data.model_copy(update={"format": "auto", "max_eval_samples": None})
    split_name = spec.eval_split or spec.split

    def read(section: Any) -> list[dict[str, Any]]:
        return list(data_mod.read_rows(section, Path.cwd(), str(data_file), split_name, task))

    rows, spec = pairs.eval_rows(read, spec, m.text_pair)  # a pair model: both texts
    return rows, spec, str(data_file)


def cross_entropy_sum(logits: np.ndarray, labels: np.ndarray, causal: bool) -> tuple[float, int]:
    """Summed cross-entropy over the counted positions (labels != -100), and how many there were.

    For causal LM the logits at position t predict token t+1, as in transformers' loss.
    """
    if causal:
        logits, labels = logits[:, :-1], labels[:, 1:]
    flat = logits.reshape(-1, logits.shape[-1]).astype(np.float64)
    gold = labels.reshape(-1)
    keep = gold != IGNORE_INDEX
    flat, gold = flat[keep], gold[keep]
    if not len(gold):
        return 0.0, 0
    top = flat.max(-1, keepdims=True)
    logz = np.log(np.exp(flat - top).sum(-1)) + top[:, 0]
    return float((logz - flat[np.arange(len(gold)), gold]).sum()), int(len(gold))


def score(
    m: SavedModel, encoded: tasks.Encoded, batch_size: int = 32, seed: int = 42
) -> dict[str, float]:
    """Loss (mean over every counted label) and the task's metrics, from the model's logits;
    ``seed``: the training seed the task's eval variant is drawn with (masked-lm's masking)."""
    task = m.spec
    total, weight, logits_all, labels_all = 0.0, 0, [], []
    for start in range(0, len(encoded), batch_size):
        batch = encoded.take(np.arange(start, min(start + batch_size, len(encoded))))
        batch = task.collate(batch, None, seed)  # None: the fixed eval variant, as training's
        logits = m.batch_logits(batch)
        if isinstance(task, protocols.ShapesEval):  # question answering masks the padding
            logits = task.eval_logits(logits, batch)
        s, n = cross_entropy_sum(logits, batch["labels"], causal=traits.shifts_labels(task))
        total, weight = total + s, weight + n
        if traits.needs_logits(task):
            logits_all.append(logits)
            labels_all.append(protocols.metric_labels(task, batch, len(batch["labels"])))
    metrics = task.metrics(total / max(weight, 1), logits_all, labels_all)
    # generated text: on PyTorch, and on the exports whose runners generate
    if m.runtime == "pytorch" or isinstance(task, protocols.OwnRunner):
        metrics.update(protocols.generated_metrics(task, m._model, m.tokenizer, encoded))
    return metrics


def run(source: Path, data_file: Path | None = None, batch_size: int = 32) -> EvalResult:
    t0 = time.perf_counter()
    m = open_model(source)
    loaded = training_recipe(m)
    rows, spec, where = load_rows(m, data_file, loaded)
    labels = m.labels()
    label2id = {name: i for i, name in enumerate(labels)} if labels else None
    encoded = m.spec.encode(rows, m.tokenizer, spec, label2id)
    text = not isinstance(m.spec, protocols.ReadsFiles)  # an image or a clip has no tokens
    unit = f"examples of {spec.max_length} tokens" if text else f"{m.spec.modality} files"
    log.info("eval: %s (%s) on %s: %d %s", m.path, m.runtime, where, len(encoded), unit)
    seed = loaded.recipe.training.seed if loaded else TrainingSection.model_fields["seed"].default
    if isinstance(m.spec, protocols.EvaluatesSaved):  # preference: rewards against a reference
        metrics = m.spec.evaluate_saved(m, encoded, loaded, batch_size)
    else:
        metrics = score(m, encoded, batch_size, seed)
    return {
        "model": str(m.path),
        "runtime": m.runtime,
        "task": m.task,
        "data": where,
        "examples": len(encoded),
        "max_length": spec.max_length if text else None,
        "metrics": {k: float(v) for k, v in metrics.items()},
        "eval_s": round(time.perf_counter() - t0, 3),
    }


def format_result(result: EvalResult) -> str:
    lines = [
        f"model     {result['model']} ({result['runtime']})",
        f"data      {result['data']} ({result['examples']} examples)",
    ]
    lines += [f"{k:<9} {v:.4f}" for k, v in result["metrics"].items()]
    return "\n".join(lines)
