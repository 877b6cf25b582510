"""How a model folder turns token vectors into one sentence embedding: the files
sentence-transformers saves beside the encoder, read without importing it.

A sentence-transformers folder is the encoder's own files (config.json, weights, tokenizer) plus
``modules.json``, which lists the modules a text goes through in order: ``Transformer`` (the
encoder, path ""), ``Pooling`` (its ``config.json``: one ``pooling_mode_*`` flag set) and
optionally ``Normalize`` (L2, no files of its own; its folder, e.g. ``2_Normalize``, may be
missing). ``sentence_bert_config.json`` gives ``max_seq_length``, where sentence-transformers
truncates. A folder without ``modules.json`` is a plain encoder: mean pooling over the attention
mask, not normalised (``DEFAULT_SOURCE`` says so in export.json).

``write`` lays the same files beside an encoder saved with ``save_pretrained`` (a
sentence-embedding run's ``final/``), so that ``SentenceTransformer(folder)`` loads it and
``read`` gives the same ``Pooling`` back. It writes the layout of sentence-transformers 2.x–5.x
(``pooling_mode_*`` flags, ``max_seq_length`` in ``sentence_bert_config.json``), which every
version since 2.0 loads, 6.x included (measured with 6.2.0: it converts the flags itself);
6.x's own layout (one ``pooling_mode`` key, the length in the tokenizer's config) is not read
by 5.x. ``read`` takes both.

Torch-free, so the task that trains embeddings (``task``), the export (``graphs``) and
``ortft predict`` read the pooling the same way (``read``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ortft.core.errors import InputError

MODES = ("mean", "cls", "max")
MASKED = -1e9  # max pooling: what a masked position holds (sentence-transformers' value)
# sentence-transformers' Pooling flags and the defaults its constructor gives a missing key
# (mean pooling is on unless the config says otherwise)
FLAGS = {
    "cls": ("pooling_mode_cls_token", False),
    "max": ("pooling_mode_max_tokens", False),
    "mean": ("pooling_mode_mean_tokens", True),
    "mean_sqrt_len_tokens": ("pooling_mode_mean_sqrt_len_tokens", False),
    "weightedmean": ("pooling_mode_weightedmean_tokens", False),
    "lasttoken": ("pooling_mode_lasttoken", False),
}
# the module kinds a folder may list (the last part of modules.json's "type")
KNOWN = ("Transformer", "Pooling", "Normalize")
DEFAULT_SOURCE = "default: no sentence-transformers modules.json (mean pooling, not normalised)"


@dataclass(frozen=True)
class Pooling:
    """One sentence embedding per text: ``mode`` over the positions where the attention mask is
    1 (``cls``: the first position), then L2-normalised when ``normalize``."""

    mode: str = "mean"
    normalize: bool = False
    max_seq_length: int | None = None  # sentence_bert_config.json: where it truncates
    lowercase: bool = False  # sentence_bert_config.json's do_lower_case: lowercase texts first
    source: str = DEFAULT_SOURCE  # which files said so

    def describe(self) -> dict[str, Any]:
        """export.json's ``pooling`` section."""
        return {
            "mode": self.mode,
            "normalize": self.normalize,
            "max_seq_length": self.max_seq_length,
            "lowercase": self.lowercase,
            "source": self.source,
        }


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except OSError as err:
        raise InputError(f"{path}: cannot read it ({err.strerror})") from None
    except json.JSONDecodeError as err:
        raise InputError(f"{path}: not valid JSON (line {err.lineno}: {err.msg})") from None


def _mode(path: Path) -> str:
    """The one pooling mode a Pooling module's config.json sets."""
    config = _json(path)
    if "pooling_mode" in config:  # sentence-transformers 6.x: a mode, or a list to concatenate
        mode = config["pooling_mode"]
        on = [mode] if isinstance(mode, str) else [str(m) for m in mode or []]
    else:
        on = [mode for mode, (key, default) in FLAGS.items() if config.get(key, default)]
    if len(on) != 1:
        raise InputError(
            f"{path}: sets {'+'.join(on) or 'no'} pooling; ortft exports exactly one of "
            f"{', '.join(MODES)}"
        )
    if on[0] not in MODES:
        raise InputError(f"{path}: {on[0]} pooling; ortft exports one of {', '.join(MODES)}")
    return on[0]


def _modules(folder: Path) -> list[tuple[str, str]]:
    """(kind, path) of each module ``modules.json`` lists, in order."""
    listed = _json(folder / "modules.json")
    if not isinstance(listed, list) or not all(
        isinstance(m, dict) and isinstance(m.get("type"), str) for m in listed
    ):
        raise InputError(f"{folder / 'modules.json'}: expected a list of modules with a type")
    modules = [(m["type"].rsplit(".", 1)[-1], str(m.get("path", ""))) for m in listed]
    other = [kind for kind, _ in modules if kind not in KNOWN]
    if other:  # a Dense or LayerNorm head would change the embedding: refuse, never drop it
        raise InputError(
            f"{folder / 'modules.json'}: lists {', '.join(other)}, which ortft does not export "
            f"(it exports {', '.join(KNOWN)})"
        )
    return modules


def read(folder: Path) -> Pooling:
    """The pooling ``folder`` describes (``Pooling()``, mean without normalisation, when it has
    no ``modules.json``); a config ortft cannot reproduce is an InputError naming the file."""
    if not (folder / "modules.json").exists():
        return Pooling()
    modules = _modules(folder)
    pools = [path for kind, path in modules if kind == "Pooling"]
    normalize = any(kind == "Normalize" for kind, _ in modules)
    if len(pools) > 1:
        raise InputError(f"{folder / 'modules.json'}: lists {len(pools)} Pooling modules")
    mode, files = "mean", ["modules.json"]
    if pools:
        mode = _mode(folder / pools[0] / "config.json")
        files.insert(0, f"{pools[0]}/config.json")
    settings = folder / "sentence_bert_config.json"
    st = _json(settings) if settings.exists() else {}
    if settings.exists():
        files.append(settings.name)
    length = st.get("max_seq_length")
    if length is None:  # 6.x saves it as the tokenizer's model_max_length, where it truncates
        length = _tokenizer_limit(folder)
        if length is not None:
            files.append(f"{TOKENIZER_CONFIG} (model_max_length)")
    return Pooling(
        mode=mode,
        normalize=normalize,
        max_seq_length=length if isinstance(length, int) and length > 0 else None,
        lowercase=bool(st.get("do_lower_case", False)),
        source=", ".join(files) + ("" if pools else " (no Pooling module: mean)"),
    )


TOKENIZER_CONFIG = "tokenizer_config.json"
NO_LIMIT = 10**9  # transformers' "no model_max_length" is 1e30 (VERY_LARGE_INTEGER)


def _tokenizer_limit(folder: Path) -> int | None:
    path = folder / TOKENIZER_CONFIG
    config = _json(path) if path.exists() else {}
    limit = config.get("model_max_length") if isinstance(config, dict) else None
    return limit if isinstance(limit, int) and 0 < limit < NO_LIMIT else None


# modules.json's module types as sentence-transformers 2.x–5.x name them (6.x maps these names
# to its own modules when it loads a folder)
TYPES = {
    "Transformer": "sentence_transformers.models.Transformer",
    "Pooling": "sentence_transformers.models.Pooling",
    "Normalize": "sentence_transformers.models.Normalize",
}


def write(folder: Path, pooling: Pooling, dimension: int) -> None:
    """sentence-transformers' files beside the encoder in ``folder`` (hidden size
    ``dimension``): ``modules.json`` (Transformer at "", Pooling at ``1_Pooling``, Normalize at
    ``2_Normalize`` when ``pooling.normalize``), ``1_Pooling/config.json`` (the one
    ``pooling_mode_*`` flag of ``pooling.mode`` on), an empty ``2_Normalize/`` (Normalize has no
    files) and ``sentence_bert_config.json`` (``max_seq_length``, ``do_lower_case``)."""
    if pooling.mode not in MODES:
        raise InputError(f"pooling mode {pooling.mode!r}: ortft writes one of {', '.join(MODES)}")
    kinds = [("Transformer", ""), ("Pooling", "1_Pooling")]
    if pooling.normalize:
        kinds.append(("Normalize", "2_Normalize"))
    modules = [
        {"idx": i, "name": str(i), "path": path, "type": TYPES[kind]}
        for i, (kind, path) in enumerate(kinds)
    ]
    flags = {key: mode == pooling.mode for mode, (key, _) in FLAGS.items()}
    (folder / "1_Pooling").mkdir(parents=True, exist_ok=True)
    _write(folder / "1_Pooling" / "config.json", {"word_embedding_dimension": dimension, **flags})
    if pooling.normalize:
        (folder / "2_Normalize").mkdir(exist_ok=True)
    _write(folder / "modules.json", modules)
    settings = {"max_seq_length": pooling.max_seq_length, "do_lower_case": pooling.lowercase}
    _write(folder / "sentence_bert_config.json", settings)


def _write(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")


def pool_tokens(hidden: Any, mask: Any, mode: str) -> Any:
    """One vector per row of ``hidden`` (a torch tensor [batch, sequence, hidden]) over the
    positions where ``mask`` is 1, as sentence-transformers' Pooling computes it: the one
    definition training (the sentence-embedding task) and the export share. Tensor methods
    only, so this module stays importable without torch."""
    keep = mask.unsqueeze(-1).to(hidden.dtype)
    if mode == "cls":
        return hidden[:, 0]
    if mode == "max":
        return hidden.masked_fill(keep == 0, MASKED).max(dim=1).values
    # mean; the clamp keeps an all-masked row at 0 rather than NaN (as theirs does)
    return (hidden * keep).sum(dim=1) / keep.sum(dim=1).clamp(min=1e-9)
