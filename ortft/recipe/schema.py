"""The recipe: a strict pydantic v2 model of everything a training run needs.

A recipe never names code to import: every choice is an enum/Literal, so a YAML file from
anywhere can be validated and run without executing anything it says.
The sections live here (``model:`` and ``adapter:`` in ``recipe/model.py``, ``logging:`` in
``recipe/tracking.py``); ``task:`` is the union of the registered tasks' options
(``recipe/task.py``, each task's options in its own ``ortft/tasks/`` file), ``hpo:`` is in
``recipe/hpo.py``, the cross-field rules in ``recipe/rules.py``. Loading (YAML + dotted
overrides, errors with their YAML line) lives in ``recipe/io.py``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from ortft.data.spec import DataFormat, DataSection  # noqa: F401 - re-exported
from ortft.recipe import backends as backend_rules
from ortft.recipe import rules
from ortft.recipe.fields import (  # noqa: F401 - re-exported: other modules import them from here
    LOWER_IS_BETTER,
    EvalMetric,
    PositiveInt,
    Section,
    metric_mode,
)
from ortft.recipe.hpo import (  # noqa: F401 - re-exported
    HpoCategorical,
    HpoFloat,
    HpoInt,
    HpoParam,
    HpoPruning,
    HpoSection,
)
from ortft.recipe.hpo import check_keys as check_hpo_keys
from ortft.recipe.model import (  # noqa: F401 - re-exported
    AdapterSection,
    Architecture,
    FromConfig,
    ModelSection,
    TokenizerSection,
    TrainTokenizer,
)
from ortft.recipe.rules import has_eval_data  # noqa: F401 - re-exported
from ortft.recipe.task import TaskField
from ortft.recipe.tracking import LoggingSection  # noqa: F401 - re-exported

FORMAT_VERSION = 1

# The recipe's `task:` type: the options of any registered task, discriminated by name
# (ortft.tasks.options(name, ...) builds one).
TaskSection = TaskField

Scheduler = Literal[
    "linear",
    "cosine",
    "cosine_with_restarts",
    "polynomial",
    "constant",
    "constant_with_warmup",
    "inverse_sqrt",
]


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
    dtype: Literal["auto", "fp32", "bf16", "fp16"] = Field(
        "fp32",
        description="Training precision: fp32; bf16 (autocast; on cpu with backend.name=torch only); "
        "fp16 (autocast + loss scaling; CUDA only, skipped steps counted in the summary); auto: "
        "bf16 where the device runs it natively (a CPU with avx512_bf16 or AMX and "
        "backend.name=torch; a GPU of compute capability 8.0 or newer), else fp32. The choice and "
        "its reason go to stderr and summary.json's precision.",
    )
    weights: Literal["fp32", "bf16", "auto"] = Field(
        "fp32",
        description="fp32: a bf16 run autocasts around the fp32 weights. bf16 (with dtype bf16 "
        "or auto, backend.name torch or auto, no deepspeed): the training forward and backward "
        "run on a bf16 copy of the model, which saves autocast's casts; the optimizer steps the "
        "fp32 weights (master weights), which checkpoints, evaluation, final/ and the export "
        "read, and gradients add up in fp32. Where dtype auto resolves to fp32 (or backend auto "
        "to ort) the run trains in fp32 and says so. auto (with backend.name auto or "
        "backend.compile auto): the probe also times the bf16 copy and trains with it where it "
        "is the fastest route.",
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
    heap: Literal["auto", "system"] = Field(
        "auto",
        description="auto: on a CPU under glibc, the training process keeps the memory it "
        "frees for the next step (no block mapped on its own, the heap never trimmed), so a "
        "step does not fault its pages in again; its RSS then stays at its peak until it ends. "
        "system: the C library's defaults. Recorded in summary.json's provenance.heap.",
    )
    gradient_checkpointing: bool = Field(
        False,
        description="backend.name=torch: recompute activations in the backward (transformers' "
        "gradient checkpointing) to save memory; the ort backend uses backend.memory_optimization_level.",
    )


class BackendSection(Section):
    name: str = Field(
        "ort",
        description="ort (ORTModule), torch (eager PyTorch), auto (time a few steps of both on "
        "the first batches, train with the faster; recorded in summary.json), or ort-ondevice "
        "(export once to ONNX training artifacts, then train in onnxruntime.training.api: no "
        "PyTorch in the loop); or a backend registered with ortft.backends.register.",
    )

    @field_validator("name")
    @classmethod
    def _registered(cls, value: str) -> str:
        from ortft.recipe import backends  # built-in names and registered ones

        known = backends.names()
        if value not in known:
            choices = ", ".join(repr(n) for n in known[:-1]) + f" or {known[-1]!r}"
            raise ValueError(f"Input should be {choices}")
        return value

    compile: backend_rules.Compile = backend_rules.compile_field()
    unpad: backend_rules.Unpad = backend_rules.unpad_field()
    dropout_masks: backend_rules.DropoutMasks = backend_rules.dropout_masks_field()
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
    pytorch_kernels: Literal["auto"] | list[backend_rules.PytorchKernel] = Field(
        "auto",
        description="Ops the ort backend runs as PyTorch kernels inside the ONNX Runtime graph "
        "(ATen nodes), where ORT's own CPU kernels are slow: gelu, layer_norm, cross_entropy, "
        "dropout, conv (2-D convolutions), index_select (row gathers: backend.unpad's). auto: "
        "all six on CPU, none on CUDA; [] keeps ORT's kernels everywhere.",
    )
    gpu_allocator: Literal["torch", "ort"] = Field(
        "torch",
        description="Where the ort backend's CUDA provider allocates on a GPU: torch (through "
        "torch's caching allocator, ORTModule's default: one memory pool; needs the "
        "torch_gpu_allocator extension) or ort (ORT's own BFC arena beside torch's pool: a "
        "fallback when that extension cannot load; the two pools do not share freed memory). "
        "No effect on CPU.",
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
        1e-4,
        description="Max |ONNX − PyTorch| allowed on the parity check (and on the generation "
        "check's logits).",
    )
    kv_cache: bool = Field(
        True,
        description="Decoders (causal-lm, instruction): export the graph with a KV cache "
        "(past_key_values inputs, present outputs; one token a step); false: the graph of the "
        "whole sequence (input_ids, attention_mask -> logits).",
    )
    required: bool = Field(
        True,
        description="A failed export check fails the run (exit 3): parity (max |diff| above "
        "the tolerance) and, for decoders and seq2seq, the generation check (the ONNX loop with "
        "the model's generation config against PyTorch's generate). false keeps the old "
        "behaviour: a failed check is recorded (export.json, summary.json), the export goes "
        "to onnx.failed/ and the run exits 0; neither check is then a gate.",
    )


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
        description="DeepSpeed config (ZeRO stage 1/2; installed by make setup; processes through "
        "torchrun or --nproc): a "
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

    @field_validator("hpo")
    @classmethod
    def _hpo_keys(cls, value: HpoSection | None) -> HpoSection | None:
        check_hpo_keys(value, cls)  # every searched key names a plain value of this schema
        return value

    @field_validator("gates")
    @classmethod
    def _gates_parse(cls, value: list[str]) -> list[str]:
        from ortft.core.errors import UsageError
        from ortft.recipe import gates

        for text in value:
            try:
                gates.parse(text)
            except UsageError as err:
                raise ValueError(str(err)) from None
        return value

    @model_validator(mode="after")
    def _combinations(self) -> Recipe:
        # A combination that cannot run is an error here, never a silent fallback (fp32, no-op).
        rules.combinations(self)
        return self

    @model_validator(mode="after")
    def _eval_users(self) -> Recipe:
        """Early stopping, best-model selection and hpo need evals with the task's metrics."""
        rules.eval_users(self)
        return self

    def selection_metric(self) -> str:
        """The metric that picks final: best."""
        es = self.training.early_stopping
        return self.checkpoint.best_metric or (es.metric if es else "eval_loss")


def default_output_dir(recipe_path: Path | None) -> Path:
    stem = recipe_path.stem if recipe_path else "run"
    return Path("runs") / stem
