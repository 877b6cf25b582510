"""The JSON shapes that cross layers, as ``TypedDict``s: export.json's report (``ExportReport``),
``ortft eval``'s result (``EvalResult``), ``ortft predict``'s results (``Prediction``, one per
input; ``Drawing``, of ``--prompt``).

They live here, at the bottom, because the protocols a family implements
(``ortft.tasks.protocols``) name them, and ``ortft.tasks`` sits below the exporter and
inference that produce them. A ``TypedDict`` is a plain ``dict`` at run time: the JSON written
is what the code puts in it, key for key and in that order; mypy checks each key read or
written. A section that only its own check or family reads stays ``dict[str, Any]``
(``Section``).
"""

from __future__ import annotations

from typing import Any, Required, TypedDict

# A report section read by the family or check that wrote it (parity, a variant, latency, the
# generation check, a family's own), not across layers.
Section = dict[str, Any]


class TokenizerReport(TypedDict):
    """export.json's ``tokenizer``: the saved tokenizer as a client gets it."""

    padding: None
    truncation: int | None
    training_max_length: int | None


class ParityReport(TypedDict, total=False):
    """export.json's ``parity``: the exported model against its reference (``summary.json``'s
    ``export.<metric>`` gates read it). Which keys it has depends on what was compared."""

    samples: int
    source: str  # where the samples come from: "eval data" | "synthetic" | ...
    against: str  # what the reference is, where it is not the PyTorch model's logits
    independent: bool  # ort-ondevice: the reference was computed apart from the copy
    max_abs_diff: float
    prediction_agreement: float
    outputs: dict[str, dict[str, float]]  # embeddings: each output's max |diff|
    min_cosine: float
    max_norm_error: float
    tolerance: float
    passed: bool
    graphs: dict[str, dict[str, Any]]  # text-to-image: each graph's check


class RuntimeReport(TypedDict, total=False):
    """One entry of export.json's ``runtimes``: an onnxruntime the export was run in."""

    package: Required[str]
    version: Required[str]
    checked: Required[str]
    max_abs_diff: float
    passed: bool


class ExportReport(TypedDict, total=False):
    """export.json, and what the exporter returns: which keys a report has depends on the task
    and the checks asked for (``docs/export.md``). ``dir`` and ``model`` are added once the
    folder is published (they are not in export.json)."""

    format_version: int
    task: str
    model_type: str | None
    opset: int
    files: dict[str, str]
    bytes: int
    export_s: float
    inputs: list[str] | dict[str, list[str]]
    outputs: list[str] | dict[str, list[str]]
    kv_cache: bool
    genai: Section  # a decoder's genai_config.json (onnxruntime-genai), or why not
    language: str | None
    pooling: Section
    parity: ParityReport
    optimize: Section
    fp16: Section
    int8: Section
    int4: Section
    latency: Section
    generation: Section
    features: Section
    end_to_end: Section
    preprocessor: Section
    preprocess: Section
    training: Section
    text_pair: dict[str, str]
    ir_version: int
    exporter: dict[str, str]  # which torch.onnx exporter wrote the graphs, on which torch, why
    tokenizer: TokenizerReport
    runtimes: list[RuntimeReport]
    links: dict[str, str]
    note: str  # ort-ondevice: final/model.onnx is the export
    skipped: str  # a task the exporter cannot write: why
    failures: list[str]
    passed: bool
    dir: str
    model: str


class EvalResult(TypedDict, total=False):
    """``ortft eval``'s result (``--json`` prints it)."""

    model: Required[str]
    runtime: Required[str]
    task: Required[str]
    data: Required[str]
    examples: Required[int]
    max_length: Required[int | None]
    metrics: Required[dict[str, float]]
    ema_weights: bool  # text-to-image: the EMA weights were scored
    eval_s: Required[float]


class Prediction(TypedDict, total=False):
    """One line of ``ortft predict``: which keys it has depends on what the model predicts."""

    index: int
    input: str  # the file read (images, audio)
    label: str  # classification
    score: float
    scores: dict[str, float]
    top_k: list[list[str | float]]  # images: [label, score], best first
    tokens: list[str]  # token classification
    tags: list[str | None]
    answer: str  # question answering
    start: int | None
    end: int | None
    filled: str  # masked-lm
    masks: list[dict[str, Any]]
    generated: str  # generation
    new_tokens: int
    text: str  # a transcript; a ranked text
    seconds: float
    cut: bool
    rank: int  # embeddings: --query
    embedding: list[float]
    reward: float  # a reward model: one response's reward
    reward_chosen: float  # ... or a pair's two, their margin and the preferred one
    reward_rejected: float
    margin: float
    preferred: str


class Drawing(TypedDict):
    """``ortft predict --prompt -o``: what was drawn."""

    image: str
    prompt: str
    negative_prompt: str | None
    height: int
    width: int
    steps: int
    guidance_scale: float
    seed: int
    scheduler: str
    runtime: str
