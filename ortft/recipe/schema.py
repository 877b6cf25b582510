"""The recipe: a strict pydantic v2 model of everything a training run needs.

A recipe never names code to import: every choice is an enum/Literal, so a YAML file from
anywhere can be validated and run without executing anything it says.
Loading (YAML + dotted overrides, errors with their YAML line) lives in ``recipe_io.py``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

FORMAT_VERSION = 1

TaskName = Literal[
    "sequence-classification",
    "causal-lm",
    "token-classification",
    "masked-lm",
    "seq2seq",
    "question-answering",
    "instruction",
]
BackendName = Literal["ort", "torch", "auto", "ort-ondevice"]
Architecture = Literal["bert", "gpt2", "t5"]
Scheduler = Literal[
    "linear",
    "cosine",
    "cosine_with_restarts",
    "polynomial",
    "constant",
    "constant_with_warmup",
    "inverse_sqrt",
]
DataFormat = Literal["auto", "csv", "json", "jsonl", "parquet", "txt", "folder", "disk", "hub"]
# Eval metrics as summary.json names them; which ones a task has is checked in Recipe.
EvalMetric = Literal[
    "eval_loss",
    "eval_accuracy",
    "eval_f1_macro",
    "eval_perplexity",
    "eval_f1",
    "eval_exact_match",
    "eval_token_f1",
]
TASK_METRICS = {
    "sequence-classification": ("eval_loss", "eval_accuracy", "eval_f1_macro"),
    "causal-lm": ("eval_loss", "eval_perplexity"),
    "token-classification": ("eval_loss", "eval_accuracy", "eval_f1", "eval_f1_macro"),
    "masked-lm": ("eval_loss", "eval_perplexity"),
    "seq2seq": ("eval_loss", "eval_perplexity", "eval_exact_match", "eval_token_f1"),
    "question-answering": ("eval_loss", "eval_exact_match", "eval_f1"),
    "instruction": ("eval_loss", "eval_perplexity"),
}
# Which task options (TaskSection fields) belong to which task; setting another task's is an error.
TASK_OPTIONS = {
    "token-classification": ("tokens_column", "tags_column"),
    "masked-lm": ("mlm_probability",),
    "seq2seq": ("source_column", "target_column", "max_target_length", "generate_samples"),
    "question-answering": (
        "question_column",
        "context_column",
        "answer_column",
        "answer_start_column",
    ),
    "instruction": ("prompt_column", "response_column", "messages_column", "template"),
}
LOWER_IS_BETTER = ("eval_loss", "eval_perplexity")


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


PositiveInt = Annotated[int, Field(ge=1)]


class FromConfig(Section):
    """A randomly initialised model built from a small config (demos, tests, benchmarks)."""

    architecture: Architecture = Field(
        description="Model family: bert (encoder), gpt2 (decoder) or t5 (encoder-decoder, for seq2seq)."
    )
    hidden_size: PositiveInt = Field(128, description="Width of the hidden states.")
    num_layers: PositiveInt = Field(2, description="Number of transformer blocks.")
    num_heads: PositiveInt = Field(2, description="Attention heads; must divide hidden_size.")
    intermediate_size: PositiveInt | None = Field(
        None, description="Feed-forward width (default 4 × hidden_size)."
    )
    max_position_embeddings: PositiveInt = Field(
        512, description="Longest sequence the model accepts."
    )

    @model_validator(mode="after")
    def _heads_divide(self) -> FromConfig:
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must divide hidden_size ({self.hidden_size})"
            )
        return self


class TrainTokenizer(Section):
    """Train a tokenizer locally from the training texts (saved with the model)."""

    kind: Literal["wordpiece", "byte-bpe"] = Field(
        "wordpiece", description="wordpiece (BERT-style, lowercased) or byte-bpe (GPT-2-style)."
    )
    vocab_size: Annotated[int, Field(ge=64, le=200_000)] = Field(
        2000, description="Target vocabulary size."
    )
    min_frequency: PositiveInt = Field(2, description="Ignore pieces seen fewer times than this.")


class TokenizerSection(Section):
    path: str | None = Field(
        None,
        description="Tokenizer directory or hub id; default: the model's own (model.name_or_path).",
    )
    train: TrainTokenizer | None = Field(
        None, description="Train a tokenizer from the training data instead of loading one."
    )

    @model_validator(mode="after")
    def _one_source(self) -> TokenizerSection:
        if self.path and self.train:
            raise ValueError("give either tokenizer.path or tokenizer.train, not both")
        return self


class ModelSection(Section):
    name_or_path: str | None = Field(
        None,
        description=(
            "Pretrained model: a local directory (relative to the recipe), "
            "'pkg://<package>/<dir>' inside an installed Python package, or a Hub id (needs network)."
        ),
    )
    from_config: FromConfig | None = Field(
        None, description="Build a randomly initialised model instead of loading weights."
    )
    tokenizer: TokenizerSection = Field(default_factory=TokenizerSection)
    dropout: Annotated[float, Field(ge=0.0, lt=1.0)] | None = Field(
        None, description="Override every dropout probability in the model (0 for exact parity)."
    )
    trust_remote_code: bool = Field(
        False,
        description=(
            "Let transformers run Python code shipped with a Hub model/tokenizer. Off unless the "
            "recipe sets it: only for models whose code you have read."
        ),
    )

    @model_validator(mode="after")
    def _one_source(self) -> ModelSection:
        if bool(self.name_or_path) == bool(self.from_config):
            raise ValueError("give exactly one of model.name_or_path or model.from_config")
        if self.from_config and not self.tokenizer.path and not self.tokenizer.train:
            raise ValueError(
                "a model built from_config needs model.tokenizer.path or model.tokenizer.train"
            )
        return self


class TaskSection(Section):
    name: TaskName = Field(
        description="What the model learns: sequence-classification, token-classification, "
        "question-answering, masked-lm, causal-lm, instruction or seq2seq."
    )
    # token-classification: one tag per word; the first sub-token of a word carries its tag
    tokens_column: str = Field(
        "tokens", description="token-classification: column with the list of words."
    )
    tags_column: str = Field(
        "tags", description="token-classification: column with one tag per word."
    )
    # masked-lm
    mlm_probability: Annotated[float, Field(gt=0.0, lt=1.0)] = Field(
        0.15,
        description="masked-lm: share of tokens selected for prediction (80% [MASK], 10% random, "
        "10% unchanged), drawn anew each epoch from the seed.",
    )
    # seq2seq
    source_column: str = Field("source", description="seq2seq: column with the input text.")
    target_column: str = Field("target", description="seq2seq: column with the output text.")
    max_target_length: Annotated[int, Field(ge=4, le=4096)] = Field(
        64, description="seq2seq: target tokens per example (padded/truncated to this)."
    )
    generate_samples: Annotated[int, Field(ge=0)] = Field(
        8,
        description="seq2seq: eval rows decoded with generate() for exact match / token F1 (0: none).",
    )
    # question-answering (extractive, SQuAD-style)
    question_column: str = Field(
        "question", description="question-answering: column with the question."
    )
    context_column: str = Field(
        "context", description="question-answering: column with the passage."
    )
    answer_column: str = Field(
        "answer_text", description="question-answering: column with the answer text."
    )
    answer_start_column: str = Field(
        "answer_start",
        description="question-answering: character offset of the answer in the context.",
    )
    # instruction (chat tuning of a causal LM)
    prompt_column: str = Field("prompt", description="instruction: column with the prompt.")
    response_column: str = Field("response", description="instruction: column with the response.")
    messages_column: str = Field(
        "messages",
        description="instruction: column with a chat ([{role, content}, ...]); used when present.",
    )
    template: Literal["auto", "simple"] = Field(
        "auto",
        description="instruction: auto uses the tokenizer's chat template when it has one, else "
        "the simple '### Instruction / ### Response' template; simple always uses the latter.",
    )

    @model_validator(mode="before")
    @classmethod
    def _from_string(cls, value: Any) -> Any:
        return {"name": value} if isinstance(value, str) else value

    @model_validator(mode="after")
    def _own_options(self) -> TaskSection:
        mine = set(TASK_OPTIONS.get(self.name, ()))
        # a default value is fine anywhere (a dumped recipe spells out every field)
        foreign = sorted(
            k
            for k in self.model_fields_set - {"name"}
            if k not in mine and getattr(self, k) != type(self).model_fields[k].default
        )
        if foreign:
            owners = {k: t for t, keys in TASK_OPTIONS.items() for k in keys}
            raise ValueError(
                ", ".join(f"task.{k} is an option of {owners[k]}" for k in foreign)
                + f", not of {self.name}"
            )
        return self


class AdapterSection(Section):
    """Parameter-efficient fine-tuning: train small adapter matrices, freeze the base model."""

    kind: Literal["lora"] = Field("lora", description="Adapter kind: lora (needs the peft extra).")
    rank: PositiveInt = Field(8, description="LoRA rank r.")
    alpha: Annotated[float, Field(gt=0)] = Field(
        16.0, description="LoRA alpha (the update is scaled by alpha/r)."
    )
    dropout: Annotated[float, Field(ge=0.0, lt=1.0)] = Field(
        0.0, description="Dropout on the LoRA input."
    )
    target_modules: Annotated[list[str], Field(min_length=1)] | None = Field(
        None,
        description="Module names to adapt (e.g. [query, value]); default: the attention "
        "projections of the architecture (bert: query/value, gpt2: c_attn, t5: q/v).",
    )
    train_head: bool = Field(
        True,
        description="Also train the new task head (classifier / qa_outputs) in full; the base stays frozen.",
    )


class DataSection(Section):
    train: str = Field(
        description=(
            "Training data: a csv/json/jsonl/parquet/txt file, a folder of class sub-folders of "
            ".txt files, a saved `datasets` directory, 'pkg://<package>/<path>', or a Hub dataset name."
        )
    )
    eval: str | None = Field(None, description="Evaluation data (same forms as train).")
    eval_fraction: Annotated[float, Field(ge=0.0, lt=1.0)] = Field(
        0.1,
        description="Held-out share of train used for eval when `eval` is not given (0: no eval).",
    )
    format: DataFormat = Field("auto", description="Input format; auto infers it from the path.")
    split: str = Field(
        "train", description="Split to read from a Hub dataset or saved DatasetDict."
    )
    eval_split: str | None = Field(
        None, description="Split for eval from a Hub dataset / DatasetDict."
    )
    decode_errors: Literal["strict", "replace"] = Field(
        "strict",
        description="Bytes that are not UTF-8: strict stops with the file and line; replace "
        "substitutes U+FFFD (for corpora with a few stray legacy-encoded bytes).",
    )
    text_column: str = Field("text", description="Column holding the text.")
    text_pair_column: str | None = Field(None, description="Second text column for pair tasks.")
    label_column: str = Field("label", description="Column holding the label (classification).")
    label_names: list[str] | None = Field(
        None, description="Label names in id order; default: the sorted distinct labels of train."
    )
    max_length: Annotated[int, Field(ge=8, le=8192)] = Field(
        128, description="Tokens per example; batches are padded to this fixed length."
    )
    packing: bool = Field(
        True, description="causal-lm: concatenate texts and cut into max_length blocks."
    )
    shuffle: bool = Field(True, description="Shuffle the training order each epoch (seeded).")
    max_train_samples: PositiveInt | None = Field(
        None, description="Use at most this many train rows."
    )
    max_eval_samples: PositiveInt | None = Field(
        None, description="Use at most this many eval rows."
    )


class EarlyStopping(Section):
    """Stop when the eval metric has not improved for `patience` evaluations in a row."""

    metric: EvalMetric = Field("eval_loss", description="Eval metric to watch.")
    mode: Literal["auto", "min", "max"] = Field(
        "auto", description="min or max is better; auto: min for loss/perplexity, max otherwise."
    )
    patience: PositiveInt = Field(3, description="Evaluations without improvement before stopping.")
    min_delta: Annotated[float, Field(ge=0)] = Field(
        0.0,
        description="An eval counts as an improvement only if it beats the best by more than this.",
    )


class TrainingSection(Section):
    epochs: Annotated[float, Field(gt=0)] | None = Field(
        None, description="Passes over the training data (ignored when max_steps is set)."
    )
    max_steps: PositiveInt | None = Field(None, description="Optimizer steps to run.")
    batch_size: PositiveInt = Field(8, description="Examples per device per micro-batch.")
    gradient_accumulation_steps: PositiveInt = Field(
        1, description="Micro-batches per optimizer step."
    )
    lr: Annotated[float, Field(gt=0, lt=1)] = Field(5e-5, description="Peak learning rate.")
    scheduler: Scheduler = Field("linear", description="transformers.get_scheduler name.")
    warmup_steps: Annotated[int, Field(ge=0)] = Field(0, description="Warm-up steps.")
    warmup_ratio: Annotated[float, Field(ge=0, lt=1)] = Field(
        0.0, description="Warm-up as a share of all steps (used when warmup_steps is 0)."
    )
    weight_decay: Annotated[float, Field(ge=0)] = Field(0.0, description="AdamW weight decay.")
    max_grad_norm: Annotated[float, Field(gt=0)] | None = Field(
        1.0, description="Clip the gradient norm to this (null: no clipping)."
    )
    seed: int = Field(42, description="Seed for weights, data order, dropout and splits.")
    log_every: PositiveInt = Field(
        10, description="Log train loss / lr / throughput every N steps."
    )
    eval_every: PositiveInt | None = Field(
        None, description="Evaluate every N steps (always at the end when there is eval data)."
    )
    early_stopping: EarlyStopping | None = Field(
        None,
        description="Stop early when an eval metric stops improving (needs eval data and eval_every).",
    )
    max_time: Annotated[float, Field(gt=0)] | None = Field(
        None,
        description=(
            "Wall-clock budget in seconds (or '90s', '15m', '2h'): stop cleanly after the step "
            "that crosses it, checkpoint, write final/ and mark the summary stopped (resumable)."
        ),
    )
    deterministic: bool = Field(
        False,
        description="Deterministic algorithms on both backends (same commit, same machine → same metrics).",
    )

    @field_validator("max_time", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> Any:
        if isinstance(value, str):
            m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([smh]?)\s*", value)
            if not m:
                raise ValueError("use seconds or a duration like '90s', '15m', '2h'")
            return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[m.group(2)]
        return value

    @model_validator(mode="after")
    def _length(self) -> TrainingSection:
        if self.epochs is None and self.max_steps is None:
            self.epochs = 1.0
        return self


class OptimizerSection(Section):
    name: Literal["adamw", "adamw_ort_fused"] = Field(
        "adamw",
        description="adamw (torch; fused/foreach kernels) or adamw_ort_fused (ONNX Runtime FusedAdam, CUDA only).",
    )
    implementation: Literal["auto", "fused", "foreach", "for-loop"] = Field(
        "auto", description="torch AdamW kernel: auto picks fused where torch has it."
    )
    betas: tuple[Annotated[float, Field(ge=0, lt=1)], Annotated[float, Field(ge=0, lt=1)]] = Field(
        (0.9, 0.999), description="Adam betas."
    )
    eps: Annotated[float, Field(gt=0)] = Field(1e-8, description="Adam epsilon.")


class PrecisionSection(Section):
    dtype: Literal["fp32", "bf16", "fp16"] = Field(
        "fp32",
        description="Training precision: fp32; bf16 (autocast; on cpu with backend.name=torch only); "
        "fp16 (autocast + loss scaling; CUDA only, skipped steps counted in the summary).",
    )

    @model_validator(mode="before")
    @classmethod
    def _from_string(cls, value: Any) -> Any:
        return {"dtype": value} if isinstance(value, str) else value


class HardwareSection(Section):
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="auto: cuda when a GPU is visible, else cpu."
    )
    threads: PositiveInt | None = Field(
        None,
        description="CPU threads for torch and ORT (default: all cores, shared by torchrun's processes).",
    )
    gradient_checkpointing: bool = Field(
        False,
        description="backend.name=torch: recompute activations in the backward (transformers' "
        "gradient checkpointing) to save memory; the ort backend uses backend.memory_optimization_level.",
    )


class BackendSection(Section):
    name: BackendName = Field(
        "ort",
        description="ort (ORTModule), torch (eager PyTorch), auto (time a few steps of both on "
        "the first batches, train with the faster; recorded in summary.json), or ort-ondevice "
        "(export once to ONNX training artifacts, then train in onnxruntime.training.api: no "
        "PyTorch in the loop).",
    )
    trainable: Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)] | None = (
        Field(
            None,
            description="Glob patterns over the model's parameter names (e.g. ['classifier.*', "
            "'bert.encoder.layer.5.*']): only matching parameters train, the rest are frozen. "
            "Default: every parameter. Works on every backend; a pattern matching nothing is an error.",
        )
    )
    allow_fallback: bool = Field(
        False,
        description="If ORTModule cannot export/run the model, train with PyTorch (loudly) instead of failing.",
    )
    log_level: Literal["VERBOSE", "INFO", "WARNING", "ERROR", "FATAL"] = Field(
        "ERROR", description="ORTModule log level (WARNING shows its feature banner)."
    )
    save_onnx: bool = Field(
        False,
        description="Save ORTModule's exported / optimized graphs to <run>/ort_graphs/ for debugging.",
    )
    memory_optimization_level: Literal[0, 1, 2] = Field(
        0,
        description="ORTModule memory optimizer: 0 off, 1 layer-wise recompute, 2 aggressive recompute.",
    )
    compute_optimizer: bool = Field(
        True, description="ORTModule compute optimizer (label/embedding sparsity)."
    )
    pytorch_kernels: Literal["auto"] | list[Literal["gelu", "layer_norm", "cross_entropy"]] = Field(
        "auto",
        description="Ops the ort backend runs as PyTorch kernels inside the ONNX Runtime graph "
        "(ATen nodes), where ORT's own CPU kernels are slow: gelu, layer_norm, cross_entropy. "
        "auto: all three on CPU, none on CUDA; [] keeps ORT's kernels everywhere.",
    )


class CheckpointSection(Section):
    output_dir: str | None = Field(
        None,
        description="Run directory (default runs/<recipe stem>, relative to the working directory).",
    )
    save_every: PositiveInt | None = Field(None, description="Write a checkpoint every N steps.")
    keep_last: PositiveInt = Field(2, description="Checkpoints kept (older ones are removed).")
    resume: str = Field(
        "auto",
        description="auto (continue an unfinished run in output_dir), never, or a checkpoint path.",
    )
    final: Literal["last", "best"] = Field(
        "last",
        description="What final/ and the ONNX export hold: the last step's weights, or the best eval's "
        "(kept in <run>/best/; needs eval data and training.eval_every).",
    )
    best_metric: EvalMetric | None = Field(
        None,
        description="Metric that picks the best eval for final: best (default: "
        "training.early_stopping.metric, else eval_loss); lower is better for loss/perplexity.",
    )


class ExportSection(Section):
    enabled: bool = Field(True, description="Export ONNX to <run>/onnx/ at the end of training.")
    opset: Annotated[int, Field(ge=14, le=20)] = Field(
        20,
        description="ONNX opset (14–20). 20 is the highest that torch 2.6's TorchScript exporter writes "
        "and ORT 1.19 runs (measured for BERT and GPT-2).",
    )
    tolerance: Annotated[float, Field(gt=0)] = Field(
        1e-4, description="Max |ONNX − PyTorch| allowed on the parity check."
    )


class LoggingSection(Section):
    tensorboard: bool = Field(
        False,
        description="Write TensorBoard event files to <run>/tensorboard/ (needs the tensorboard extra).",
    )
    plot: bool = Field(
        False, description="Write <run>/curves.png, loss and eval curves (needs matplotlib)."
    )


class HpoFloat(Section):
    type: Literal["uniform", "loguniform"] = Field(
        description="uniform, or loguniform (log scale)."
    )
    low: float = Field(description="Lower bound (inclusive).")
    high: float = Field(description="Upper bound (inclusive).")

    @model_validator(mode="after")
    def _bounds(self) -> HpoFloat:
        if not self.low < self.high:
            raise ValueError(f"low ({self.low}) must be below high ({self.high})")
        if self.type == "loguniform" and self.low <= 0:
            raise ValueError("loguniform needs low > 0")
        return self


class HpoInt(Section):
    type: Literal["int"] = Field(description="An integer in [low, high].")
    low: int = Field(description="Lower bound (inclusive).")
    high: int = Field(description="Upper bound (inclusive).")
    step: PositiveInt = Field(1, description="Spacing of the values.")
    log: bool = Field(False, description="Sample on a log scale (needs low >= 1 and step 1).")

    @model_validator(mode="after")
    def _bounds(self) -> HpoInt:
        if not self.low < self.high:
            raise ValueError(f"low ({self.low}) must be below high ({self.high})")
        if self.log and (self.low < 1 or self.step != 1):
            raise ValueError("log needs low >= 1 and step 1")
        return self


class HpoCategorical(Section):
    type: Literal["categorical"] = Field(description="One of a list of values.")
    choices: Annotated[list[str | int | float | bool], Field(min_length=1)] = Field(
        description="The values to choose from."
    )


HpoParam = Annotated[HpoFloat | HpoInt | HpoCategorical, Field(discriminator="type")]


class HpoPruning(Section):
    enabled: bool = Field(
        True, description="Median pruning on the metric at each eval (needs eval_every)."
    )
    startup_trials: Annotated[int, Field(ge=0)] = Field(
        2, description="Trials that always run to the end before any is pruned."
    )
    warmup_evals: Annotated[int, Field(ge=0)] = Field(
        0, description="Evals of a trial before it can be pruned."
    )


class HpoSection(Section):
    """`ortft hpo`: the search space (dotted recipe keys) and the objective."""

    metric: EvalMetric = Field(
        "eval_loss", description="Objective: this eval metric of the trial's final/ model."
    )
    direction: Literal["auto", "minimize", "maximize"] = Field(
        "auto", description="auto: minimize loss/perplexity, maximize accuracy/f1_macro."
    )
    params: dict[str, HpoParam] = Field(
        description="Search space: dotted recipe key (e.g. training.lr) -> "
        "{type: uniform|loguniform|int|categorical, ...}."
    )
    pruning: HpoPruning = Field(default_factory=HpoPruning)
    seed: int = Field(0, description="Seed of the TPE sampler.")

    @model_validator(mode="after")
    def _keys(self) -> HpoSection:
        if not self.params:
            raise ValueError("hpo.params needs at least one parameter")
        bad = [k for k in self.params if not _is_tunable(k)]
        if bad:
            raise ValueError(
                f"not a tunable recipe key: {', '.join(bad)} "
                "(use a dotted key of a value, e.g. training.lr)"
            )
        return self


def _is_tunable(key: str) -> bool:
    """Whether `key` (dotted) names a plain value in the recipe schema (not a section, not hpo)."""
    model: Any = Recipe
    parts = key.split(".")
    if parts[0] in ("hpo", "deepspeed"):
        return False
    for i, part in enumerate(parts):
        field = model.model_fields.get(part) if isinstance(model, type) else None
        if field is None:
            return False
        ann = field.annotation
        section = next(
            (
                a
                for a in (getattr(ann, "__args__", None) or (ann,))
                if isinstance(a, type) and issubclass(a, BaseModel)
            ),
            None,
        )
        if i == len(parts) - 1:
            return section is None
        if section is None:
            return False
        model = section
    return False


ONDEVICE_TASKS = ("sequence-classification", "causal-lm")  # onnx_tools.TRAINING_TASKS
ONDEVICE_SCHEDULERS = ("linear", "cosine", "constant", "constant_with_warmup")


def _check_ondevice(r: Recipe) -> None:
    """What backend.name=ort-ondevice supports; the rest is a recipe error, never a no-op."""
    problems = []
    if r.task.name not in ONDEVICE_TASKS:
        problems.append(f"task {r.task.name} (supported: {', '.join(ONDEVICE_TASKS)})")
    if r.model.from_config and r.model.from_config.architecture == "t5":
        problems.append("model.from_config.architecture=t5 (bert and gpt2 are measured)")
    if r.adapter is not None:
        problems.append("adapter (use backend.trainable to train part of the model)")
    if r.training.scheduler not in ONDEVICE_SCHEDULERS:
        problems.append(
            f"training.scheduler={r.training.scheduler} "
            f"(supported: {', '.join(ONDEVICE_SCHEDULERS)})"
        )
    if r.training.early_stopping is not None or r.checkpoint.final == "best":
        problems.append("training.early_stopping / checkpoint.final=best")
    if r.optimizer.name != "adamw":
        problems.append(f"optimizer.name={r.optimizer.name} (ORT's AdamW graph is used)")
    if problems:
        raise ValueError("backend.name=ort-ondevice does not support " + "; ".join(problems))


def has_eval_data(data: DataSection) -> bool:
    return (
        bool(data.eval)
        or data.eval_fraction > 0
        or (data.format == "hub" and bool(data.eval_split))
    )


def metric_mode(metric: str, mode: str = "auto") -> str:
    """ "min" or "max": which direction of `metric` is better."""
    if mode != "auto":
        return mode
    return "min" if metric in LOWER_IS_BETTER else "max"


class Recipe(Section):
    model: ModelSection
    task: TaskSection
    data: DataSection
    training: TrainingSection = Field(default_factory=TrainingSection)
    optimizer: OptimizerSection = Field(default_factory=OptimizerSection)
    precision: PrecisionSection = Field(default_factory=PrecisionSection)
    hardware: HardwareSection = Field(default_factory=HardwareSection)
    deepspeed: str | dict[str, Any] | None = Field(
        None,
        description="DeepSpeed config (ZeRO stage 1/2; needs the deepspeed extra and torchrun): a "
        "JSON path or an inline mapping; batch sizes and fp16/bf16 must agree with the recipe.",
    )
    backend: BackendSection = Field(default_factory=BackendSection)
    adapter: AdapterSection | None = Field(
        None, description="Train a LoRA adapter instead of every weight (needs the peft extra)."
    )
    checkpoint: CheckpointSection = Field(default_factory=CheckpointSection)
    export: ExportSection = Field(default_factory=ExportSection)
    logging: LoggingSection = Field(default_factory=LoggingSection)
    hpo: HpoSection | None = Field(
        None, description="Search space and objective for `ortft hpo` (ignored by train)."
    )
    gates: list[str] = Field(
        default_factory=list,
        description=(
            "Quality gates checked at the end, e.g. 'eval.accuracy>=0.9', 'train.loss<=0.5', "
            "'throughput.samples_per_s>=20'; a failed gate exits 3."
        ),
    )

    @field_validator("gates")
    @classmethod
    def _gates_parse(cls, value: list[str]) -> list[str]:
        from ortft.errors import UsageError
        from ortft.run import gates

        for text in value:
            try:
                gates.parse(text)
            except UsageError as err:
                raise ValueError(str(err)) from None
        return value

    @model_validator(mode="after")
    def _combinations(self) -> Recipe:
        # A combination that cannot run is an error here, never a silent fallback (fp32, no-op).
        # hardware.device=auto is checked again once resolved (runtime.check_precision).
        dtype, device, backend = self.precision.dtype, self.hardware.device, self.backend.name
        if dtype == "fp16" and device == "cpu":
            raise ValueError(
                "precision.dtype=fp16 needs CUDA: PyTorch has no fp16 training on cpu; "
                "use bf16 (backend.name=torch) or fp32"
            )
        if dtype == "bf16" and device == "cpu" and backend in ("ort", "auto"):
            raise ValueError(
                "precision.dtype=bf16 on cpu needs backend.name=torch: ONNX Runtime's CPU "
                "provider has no bf16 MatMul"
            )
        if dtype != "fp32" and backend == "ort-ondevice":
            raise ValueError(
                f"precision.dtype={dtype}: backend.name=ort-ondevice trains in fp32 only"
            )
        if self.hardware.gradient_checkpointing and backend != "torch":
            raise ValueError(
                "hardware.gradient_checkpointing is for backend.name=torch: ORTModule builds "
                "its own backward graph, so it would save nothing; use "
                "backend.memory_optimization_level=1 (or 2) instead"
            )
        if isinstance(self.deepspeed, dict):
            from ortft.backends import deepspeed as zero

            problems = zero.check(self.deepspeed, self)
            if problems:
                raise ValueError("deepspeed: " + "; ".join(problems))
        elif isinstance(self.deepspeed, str) and not self.deepspeed.endswith(".json"):
            raise ValueError(f"deepspeed: {self.deepspeed!r} is not a .json file path")
        if self.optimizer.name == "adamw_ort_fused" and self.hardware.device == "cpu":
            raise ValueError("optimizer.name=adamw_ort_fused needs CUDA; use adamw on cpu")
        if self.optimizer.name == "adamw_ort_fused" and self.backend.name != "ort":
            raise ValueError("optimizer.name=adamw_ort_fused needs backend.name=ort")
        if self.backend.name == "ort-ondevice":
            _check_ondevice(self)
        if self.adapter is not None and self.backend.trainable:
            raise ValueError(
                "backend.trainable and adapter both choose what trains; use one of them"
            )
        if self.adapter is not None and self.backend.name == "auto":
            raise ValueError(
                "adapter: backend.name=auto times full fine-tuning, not the adapter; "
                "choose backend.name=ort or torch"
            )
        fc, task = self.model.from_config, self.task.name
        if fc and (fc.architecture == "t5") != (task == "seq2seq"):
            raise ValueError(
                f"model.from_config.architecture={fc.architecture} cannot learn {task}: "
                "seq2seq needs t5, every other task bert or gpt2"
            )
        if fc and task == "masked-lm" and fc.architecture != "bert":
            raise ValueError("masked-lm needs an encoder: model.from_config.architecture=bert")
        return self

    @model_validator(mode="after")
    def _eval_users(self) -> Recipe:
        """Early stopping, best-model selection and hpo need evals with the task's metrics."""
        t, users = self.training, []
        if t.early_stopping:
            users.append(("training.early_stopping", t.early_stopping.metric, True))
        if self.checkpoint.final == "best":
            users.append(("checkpoint.final=best", self.selection_metric(), True))
        if self.hpo:
            users.append(("hpo", self.hpo.metric, self.hpo.pruning.enabled))
        for who, metric, needs_every in users:
            if metric not in TASK_METRICS[self.task.name]:
                raise ValueError(
                    f"{who}: {metric} is not a metric of {self.task.name} "
                    f"(one of {', '.join(TASK_METRICS[self.task.name])})"
                )
            if not has_eval_data(self.data):
                raise ValueError(f"{who} needs eval data: set data.eval or data.eval_fraction > 0")
            if needs_every and not t.eval_every:
                raise ValueError(f"{who} needs training.eval_every (evaluations during training)")
        return self

    def selection_metric(self) -> str:
        """The metric that picks final: best."""
        es = self.training.early_stopping
        return self.checkpoint.best_metric or (es.metric if es else "eval_loss")


def default_output_dir(recipe_path: Path | None) -> Path:
    stem = recipe_path.stem if recipe_path else "run"
    return Path("runs") / stem
