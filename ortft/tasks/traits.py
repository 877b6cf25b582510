"""What a task declares when it is not what most tasks are: one protocol per member, named as
the member is, each with the function the core reads it through, which gives the default for a
task that does not implement it (``Task`` itself holds none of them).

A built-in task implements one by setting the member as a class attribute (``is_decoder = True``);
so does a task registered from outside ortft (``ortft.tasks.register``) that sets the attribute
as the ``Task`` base once did. The hooks a family implements with code are in
``ortft.tasks.protocols``; what the data layer asks of a task (its columns, labels, files) is in
``ortft.data.checks``, ``ortft.data.rows``, ``ortft.data.encoded`` and ``ortft.data.batches``.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

# How a task's ONNX export is laid out, named by its family: ``encoder`` (one row of logits per
# example, the default), ``per-token``, ``decoder`` and the families' own layouts. The core reads
# no kind: each family's hooks (``ortft.tasks.protocols``) build and check its graphs, so a new
# family names its own without touching this module.
ExportKind = str


@runtime_checkable
class Decodes(Protocol):
    """A decoder (causal LMs, seq2seq, speech): called with ``use_cache=False``, since ORTModule
    cannot flatten a KV cache (``Task.forward``, and eval's call of a saved PyTorch model)."""

    @property
    def is_decoder(self) -> bool: ...


def decodes(task: object) -> bool:
    """Whether ``task`` is called as a decoder (``Decodes``); False for the rest."""
    return isinstance(task, Decodes) and task.is_decoder


@runtime_checkable
class ShiftsLabels(Protocol):
    """A causal LM: position t predicts ``labels[t + 1]``, so the loss (``Task.counted``) and
    eval count the labels from the second on."""

    @property
    def shift_labels(self) -> bool: ...


def shifts_labels(task: object) -> bool:
    """Whether ``task``'s model predicts ``labels[:, 1:]`` (``ShiftsLabels``); False."""
    return isinstance(task, ShiftsLabels) and task.shift_labels


@runtime_checkable
class KeepsLogits(Protocol):
    """A task whose metrics read the eval logits (classification, tagging, question answering,
    images, embeddings): eval keeps them only for such a task."""

    @property
    def needs_logits(self) -> bool: ...


def needs_logits(task: object) -> bool:
    """Whether eval keeps ``task``'s logits for its metrics (``KeepsLogits``); False."""
    return isinstance(task, KeepsLogits) and task.needs_logits


@runtime_checkable
class PadsUnread(Protocol):
    """A task whose loss reads no padded position of the encoder's output (the first token,
    labels -100 at padding, or a masked pooling): ``backend.unpad`` may skip them
    (``ortft/backends/torch/unpad.py``)."""

    @property
    def pads_unread(self) -> bool: ...


def pads_unread(task: object) -> bool:
    """Whether ``backend.unpad`` applies to ``task`` (``PadsUnread``); False."""
    return isinstance(task, PadsUnread) and task.pads_unread


@runtime_checkable
class TrainsOnDevice(Protocol):
    """A task measured with ``backend.name=ort-ondevice`` and ``export --training-artifacts``
    (sequence classification, causal LM)."""

    @property
    def ondevice(self) -> bool: ...


def ondevice(task: object) -> bool:
    """Whether ``task`` trains on ONNX Runtime's on-device API (``TrainsOnDevice``); False."""
    return isinstance(task, TrainsOnDevice) and task.ondevice


@runtime_checkable
class ExportsAs(Protocol):
    """A task whose export is not the default ``encoder`` layout (``ExportKind``)."""

    @property
    def export_kind(self) -> ExportKind: ...


def export_kind(task: object) -> ExportKind:
    """How ``task``'s export lays out its logits (``ExportsAs``); ``encoder`` by default."""
    return task.export_kind if isinstance(task, ExportsAs) else "encoder"


@runtime_checkable
class SkipsExport(Protocol):
    """A task the exporter cannot write (image-text-to-text until its export lands; its recipe
    rule refuses export.enabled): ``ortft train`` says why and skips the export instead of
    failing, ``ortft export`` stops with the reason."""

    @property
    def export_skip(self) -> str | None: ...


def export_skip(task: object) -> str | None:
    """Why ``task`` is not exported (``SkipsExport``); None: it is."""
    return task.export_skip if isinstance(task, SkipsExport) else None


@runtime_checkable
class Predicts(Protocol):
    """A task ``ortft predict`` answers: what it gives per input, "label" (with scores),
    "tags" (one per word), "answer" (a span of the context), "fill-mask" (each [MASK]'s token),
    "generate" (text), "image-label" (an image file's label, scores and top 5), "transcript"
    (an audio file's text), "embedding" (a vector)."""

    @property
    def predicts(self) -> str | None: ...


def predicts(task: object) -> str | None:
    """What ``ortft predict`` gives per input of ``task`` (``Predicts``); None: it refuses."""
    return task.predicts if isinstance(task, Predicts) else None


@runtime_checkable
class KnowsArchitectures(Protocol):
    """A task a plain Hugging Face model (no ortft recipe) is read as by its
    ``config.architectures``: eval, predict and ``ortft export`` of such a folder fall back to
    the first task whose substrings one of them holds (``ortft.tasks.from_architecture``)."""

    @property
    def hf_architectures(self) -> tuple[str, ...]: ...


def hf_architectures(task: object) -> tuple[str, ...]:
    """The architecture substrings that imply ``task`` (``KnowsArchitectures``); none."""
    return task.hf_architectures if isinstance(task, KnowsArchitectures) else ()


@runtime_checkable
class ReadsModalities(Protocol):
    """A task whose models may read first (their class's main input) any of several
    modalities: a vision-language model reads an image and a text, and its class names either
    (LLaVA ``pixel_values``, Idefics3 ``input_ids``)."""

    @property
    def reads_modalities(self) -> tuple[str, ...]: ...


def reads_modalities(task: Any) -> tuple[str, ...]:
    """What a model fitting ``task`` may read first (``ReadsModalities``); its modality."""
    if isinstance(task, ReadsModalities):
        return task.reads_modalities
    return (task.modality,)


@runtime_checkable
class Starts(Protocol):
    """A task ``ortft init --task`` writes a commented starter recipe for: the recipe's text,
    with ``{name}`` where the file's name goes and ``{backend}`` where the route does."""

    @property
    def starter(self) -> str: ...


def starter(task: object) -> str | None:
    """``task``'s starter recipe (``Starts``); None: ``ortft init`` has none for it."""
    return task.starter if isinstance(task, Starts) else None


@runtime_checkable
class AdaptsAs(Protocol):
    """A task whose LoRA model is one of peft's task models (reward-model: ``SEQ_CLS``, whose
    ``score`` head trains in full) rather than peft's plain ``PeftModel``."""

    @property
    def peft_task_type(self) -> str: ...


def peft_task_type(task: object) -> str | None:
    """peft's ``task_type`` for ``task``'s adapter (``AdaptsAs``); None: the plain model."""
    return task.peft_task_type if isinstance(task, AdaptsAs) else None
