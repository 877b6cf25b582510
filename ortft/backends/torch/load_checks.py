"""Checks that a pretrained model folder loads right: its kind, weights, tokenizer and task head.

A model that loads wrong must fail at once, in one line naming the file or field (exit 2), or
say what ortft did about it. Three ways it used to go wrong (transformers 5.24):
- a truncated ``model.safetensors`` raised a SafetensorError traceback;
- a folder without tokenizer files gave a 5-token BertTokenizer that maps every word to [UNK],
  and the run trained on it and exited 0 (eval accuracy 0.19 on the quickstart data);
- a checkpoint fine-tuned on 2 labels, trained on data with 5, raised transformers'
  ``ignore_mismatched_sizes`` error; one whose labels were the data's in another order loaded
  and silently swapped the classes.
A folder of another kind (a BERT given to image-classification, a ViT to speech-recognition)
is named as such before its tokenizer or processor is read (``check_fits``).
"""

from __future__ import annotations

import json
import logging
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from ortft.core.errors import InputError

log = logging.getLogger("ortft")

# The files a Hugging Face tokenizer is read from (fast, WordPiece, BPE, SentencePiece).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "spiece.model",
    "sentencepiece.bpe.model",
    "tokenizer.model",
)
# Padded embeddings are normal (GPT-2: 50257 tokens, often 50304 rows, 98 %); a vocabulary
# under half the rows is a tokenizer of another model, or transformers' 5-token stand-in.
MIN_VOCAB_SHARE = 0.5
# A tokenizer made for this text maps well under 1 % of it to [UNK]; 20 % is a wrong one.
MAX_UNK_SHARE = 0.2
SAMPLE_ROWS = 256


# --------------------------------------------------------------------------- weights


def check_weights(folder: Path) -> None:
    """Every ``*.safetensors`` in ``folder`` holds all the bytes its header promises.

    Reads only the header (8 bytes of length + JSON), so a truncated download is named before
    transformers starts loading (it would fail mid-load with a SafetensorError traceback)."""
    if not folder.is_dir():
        return
    for path in sorted(folder.glob("*.safetensors")) + sorted(folder.glob("*.bin")):
        problem = (
            _safetensors_problem(path) if path.suffix == ".safetensors" else _zip_problem(path)
        )
        if problem:
            raise InputError(f"{path}: {problem}; download or save the model again")


def _zip_problem(path: Path) -> str | None:
    """torch.save writes a zip archive; a cut one has lost its central directory (at the end)."""
    import zipfile

    try:
        with open(path, "rb") as fh:
            magic = fh.read(4)
    except OSError as err:
        return f"cannot read ({err.strerror or err})"
    if magic == b"PK\x03\x04" and not zipfile.is_zipfile(path):
        return f"truncated torch weights file ({path.stat().st_size} bytes, no zip directory)"
    return None  # complete, or a legacy pickle that torch.load checks itself


def _safetensors_problem(path: Path) -> str | None:
    size = path.stat().st_size
    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                return f"truncated safetensors file ({size} bytes)"
            (length,) = struct.unpack("<Q", head)
            if length > size - 8:
                return f"truncated safetensors file (header of {length} bytes, file {size})"
            header = json.loads(fh.read(length))
    except (OSError, ValueError) as err:
        return f"not a readable safetensors file ({err})"
    if not isinstance(header, dict):
        return "not a safetensors file (its header is not a JSON object)"
    ends = [
        v["data_offsets"][1]
        for k, v in header.items()
        if k != "__metadata__" and isinstance(v, dict) and len(v.get("data_offsets", ())) == 2
    ]
    need = 8 + length + max(ends, default=0)
    if need > size:
        return f"truncated safetensors file ({size} of {need} bytes)"
    return None


def load_errors() -> tuple[type[BaseException], ...]:
    """What transformers' from_pretrained raises on unreadable weights (besides OSError and
    ValueError): safetensors' own error, and what torch.load raises on a cut pickle."""
    import pickle

    from safetensors import SafetensorError

    return (SafetensorError, EOFError, pickle.UnpicklingError)


# --------------------------------------------------------------------------- model kind

# what a model reads first (its class's main_input_name), as the modality a task feeds
READS = {
    "input_ids": "text",
    "pixel_values": "image",
    "input_features": "audio",
    "input_values": "audio",
}


def check_fits(folder: str, task: Any, trust_remote_code: bool) -> None:
    """The folder's model is one ``task.auto_class`` builds, reading what the task feeds
    (``task.modality``); else one line naming the folder and why, before its tokenizer or
    processor is read (which would fail on something beside the point: a BERT has no image
    processor)."""
    import transformers
    from transformers import AutoConfig, AutoModel

    try:
        config = AutoConfig.from_pretrained(folder, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError):
        return  # build_model reports a config it cannot read
    if getattr(config, "auto_map", None):
        return  # remote code (trust_remote_code) registers its own classes
    auto = getattr(transformers, task.auto_class)
    built = _mapped(auto, config)
    cls = built or _mapped(AutoModel, config)
    reads = READS.get(getattr(cls, "main_input_name", ""))
    kind = getattr(config, "model_type", None) or type(config).__name__
    archs = getattr(config, "architectures", None) or []
    named = f" ({archs[0]})" if archs else ""
    what = f"model.name_or_path: {folder} holds a {kind} model{named}"
    # a task may take models that read more than its modality first (a vision-language
    # model's class reads input_ids or pixel_values first: ``model_reads``)
    accepted = getattr(task, "model_reads", (task.modality,))
    if reads is not None and reads not in accepted:
        raise InputError(
            f"{what}, {_a(reads)} model ({cls.main_input_name}); {task.name} needs "
            f"{_a(task.modality)} model"
        )
    if built is None:
        raise InputError(
            f"{what}; {task.name} builds an {auto.__name__}, and transformers has none for {kind}"
        )


def _a(word: str) -> str:
    return f"an {word}" if word[0] in "aeiou" else f"a {word}"


def _mapped(auto: Any, config: Any) -> Any:
    """The class ``auto`` builds for ``config`` (the first of deit's and levit's two), or None."""
    try:
        cls = auto._model_mapping[type(config)]
    except (KeyError, AttributeError):
        return None
    return cls[0] if isinstance(cls, tuple | list) else cls


# --------------------------------------------------------------------------- tokenizer


def check_tokenizer(
    tokenizer: Any, rows: int | None, texts: list[str], field: str, folder: str
) -> None:
    """The tokenizer fits a model of ``rows`` embedding rows (None: unknown) and the texts.

    ``field`` names the recipe field the tokenizer came from, ``folder`` where it was read."""
    size = len(tokenizer)
    top = max(tokenizer.get_vocab().values(), default=-1)
    if rows is not None and top >= rows:
        raise InputError(
            f"{field}: the tokenizer has token ids up to {top} but the model has {rows} "
            f"embedding rows; it is not this model's tokenizer{_lacking(folder)}"
        )
    if rows is not None and size < MIN_VOCAB_SHARE * rows:
        raise InputError(
            f"{field}: the tokenizer has {size} tokens for the model's {rows} embedding rows "
            f"(under {MIN_VOCAB_SHARE:.0%}); it is not this model's tokenizer{_lacking(folder)}"
        )
    unk = tokenizer.unk_token_id
    if unk is None or not texts:
        return  # byte-level BPE has no unknown token: every text encodes
    step = max(1, len(texts) // SAMPLE_ROWS)
    sample = texts[::step][:SAMPLE_ROWS]
    ids = [i for row in tokenizer(sample, add_special_tokens=False)["input_ids"] for i in row]
    share = sum(i == unk for i in ids) / max(len(ids), 1)
    if share > MAX_UNK_SHARE:
        raise InputError(
            f"{field}: {share:.0%} of the tokens of {len(sample)} training rows are "
            f"{tokenizer.unk_token} (over {MAX_UNK_SHARE:.0%}); the tokenizer does not fit "
            f"this data{_lacking(folder)}"
        )


def _lacking(folder: str) -> str:
    path = Path(folder)
    if not path.is_dir():
        return ""
    if any((path / name).exists() for name in TOKENIZER_FILES):
        return f" (read from {path})"
    return (
        f" ({path} has none of {', '.join(TOKENIZER_FILES[:5])}, ...: copy the model's "
        "tokenizer files there or set model.tokenizer.path)"
    )


def embedding_rows(config: Any) -> int | None:
    """The model's input embedding rows from its config (multimodal ones: the text config)."""
    rows = getattr(config, "vocab_size", None)
    if rows is None:
        rows = getattr(getattr(config, "text_config", None), "vocab_size", None)
    return rows if isinstance(rows, int) and rows > 0 else None


# --------------------------------------------------------------------------- the task head


@dataclass
class HeadPlan:
    """What to do with a pretrained classification head, decided from its config's labels."""

    old_labels: list[str]
    new_labels: list[str]
    action: str  # "kept" | "reordered" | "reinitialised"; "new" once loaded without a head

    @property
    def resize(self) -> bool:
        """The head has another number of rows: transformers must not load it."""
        return len(self.old_labels) != len(self.new_labels)


def plan_head(config: Any, labels: list[str]) -> HeadPlan:
    """Keep the head only when its label names are the data's, reordered when only the order
    differs; any other head is started afresh (as ``ignore_mismatched_sizes`` would)."""
    id2label = getattr(config, "id2label", None) or {}
    old = [str(id2label.get(i, id2label.get(str(i), f"LABEL_{i}"))) for i in range(len(id2label))]
    if old == labels:
        action = "kept"
    elif sorted(old) == sorted(labels) and len(set(old)) == len(old):
        action = "reordered"
    else:
        action = "reinitialised"
    return HeadPlan(old, list(labels), action)


def settle_head(model: nn.Module, plan: HeadPlan, info: dict[str, Any]) -> dict[str, Any]:
    """Apply ``plan`` to the loaded model; the record for the log and summary.json."""
    head = _head_modules(model)
    names = {f"{name}.{p}" for name, m in head for p, _ in m.named_parameters(recurse=False)}
    if names & set(info.get("missing_keys") or ()):
        plan.action = "new"  # the checkpoint has no head (a base model): transformers made one
    elif plan.action == "reordered":
        _permute_rows(model, head, [plan.old_labels.index(n) for n in plan.new_labels])
    elif plan.action == "reinitialised":  # the whole head, not only its resized rows
        _reinitialise(model, head)
    record = {"old_labels": plan.old_labels, "new_labels": plan.new_labels, "action": plan.action}
    if plan.action == "reinitialised":
        log.warning(
            "classification head: the checkpoint's labels %s are not the data's %s; "
            "training a new head from scratch",
            plan.old_labels,
            plan.new_labels,
        )
    elif plan.action == "reordered":
        log.info(
            "classification head: the checkpoint's rows reordered to the data's labels %s",
            plan.new_labels,
        )
    elif plan.action == "new":
        log.info("classification head: new (the checkpoint has none), labels %s", plan.new_labels)
    model.ortft_head = record  # type: ignore[assignment]  # read back by head_record
    return record


def head_record(model: nn.Module) -> dict[str, Any] | None:
    return getattr(model, "ortft_head", None)


def _head_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The modules outside the base model (BERT's ``classifier``, GPT-2's ``score``)."""
    prefix = getattr(model, "base_model_prefix", "")
    return [
        (name, m)
        for name, m in model.named_modules()
        if name and name != prefix and not name.startswith(f"{prefix}.")
    ]


def _reinitialise(model: nn.Module, head: list[tuple[str, nn.Module]]) -> None:
    """Start every head module afresh with the model's own init: a head of the same shape was
    loaded, and ignore_mismatched_sizes renews only the resized tensors (RoBERTa's
    ``classifier.dense`` would keep the old classes' features). transformers 5 marks every
    loaded tensor ``_is_hf_initialized`` and its init functions skip those: clear it first."""
    for _, module in head:
        for param in module.parameters(recurse=False):
            param._is_hf_initialized = False  # type: ignore[attr-defined]
        model._init_weights(module)  # type: ignore[operator]


def _permute_rows(model: nn.Module, head: list[tuple[str, nn.Module]], order: list[int]) -> None:
    """Row i of the output layer becomes the checkpoint's row ``order[i]``: data label i keeps
    the class it had. The output layer is the head's last Linear with a row per label
    (RoBERTa's ``classifier.out_proj`` after its ``dense``)."""
    import torch

    n = len(order)
    outs = [m for _, m in head if isinstance(m, nn.Linear) and m.out_features == n]
    if not outs:
        raise InputError(
            f"model.name_or_path: cannot find the {type(model).__name__} head's output "
            f"layer to reorder its {n} labels"
        )
    layer = outs[-1]
    index = torch.tensor(order)
    with torch.no_grad():
        layer.weight.copy_(layer.weight[index].clone())
        if layer.bias is not None:
            layer.bias.copy_(layer.bias[index].clone())


def sample_rows(rows: Any) -> Any:
    """Up to SAMPLE_ROWS training rows spread over the split (of ``Rows``, a selection, which
    keeps each row's number in its file for an error); none of a stream (it is read once, by
    the loop)."""
    try:
        n = len(rows)
    except TypeError:
        return []
    index = range(0, n, max(1, n // SAMPLE_ROWS))[:SAMPLE_ROWS]
    return rows.select(index) if hasattr(rows, "select") else [rows[i] for i in index]
