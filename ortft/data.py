"""Data: read rows from files / folders / datasets, split, tokenize once (cached), batch.

Everything the model sees is a fixed [batch_size, max_length] array, so ORTModule exports
its graph once instead of on every new shape. Batch order comes from a seeded permutation
per epoch, so a resumed run sees exactly the batches an uninterrupted one would.
"""

from __future__ import annotations

import bz2
import csv
import gzip
import hashlib
import io
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ortft import batches, fsutil
from ortft.errors import InputError
from ortft.recipe.io import LoadedRecipe, looks_local
from ortft.recipe.schema import DataSection
from ortft.tasks import Encoded, Task

log = logging.getLogger("ortft")

CACHE_VERSION = 1


# data fields that change how batches are cut, not what is tokenized (not in the cache key)
BATCHING_FIELDS = {"padding", "pad_to_multiple_of", "buckets", "group_by_length", "shuffle"}


def cache_root() -> Path:
    return Path(os.environ.get("ORTFT_CACHE", Path.home() / ".cache" / "ortft"))


# --------------------------------------------------------------------------- reading rows


def _infer_format(path: Path) -> str:
    if path.is_dir():
        if (path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists():
            return "disk"
        return "folder"
    suffixes = [s.lower() for s in path.suffixes if s.lower() not in {".bz2", ".gz"}]
    ext = suffixes[-1].lstrip(".") if suffixes else ""
    if ext in {"csv", "tsv", "json", "jsonl", "parquet", "txt"}:
        return ext
    raise InputError(f"{path}: cannot tell the data format from the name; set data.format")


def _open_text(path: Path, errors: str) -> io.TextIOBase:
    # utf-8-sig: a byte-order mark (common in spreadsheet exports) must not become part of
    # the first column's name
    name = path.name.lower()
    if name.endswith(".bz2"):
        return io.TextIOWrapper(bz2.open(path, "rb"), encoding="utf-8-sig", errors=errors)
    if name.endswith(".gz"):
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8-sig", errors=errors)
    return open(path, encoding="utf-8-sig", errors=errors, newline="")


def _not_utf8(path: Path) -> InputError:
    """Strict decoding, never silent U+FFFD: name the file and the line of the first bad byte."""
    name = path.name.lower()
    opener = bz2.open if name.endswith(".bz2") else gzip.open if name.endswith(".gz") else open
    with opener(path, "rb") as fh:
        raw = fh.read()
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        return InputError(
            f"{path}:{line}: not UTF-8 text (byte 0x{raw[err.start]:02x}); "
            "convert the file to UTF-8 or set data.decode_errors=replace"
        )
    return InputError(
        f"{path}: not UTF-8 text; convert the file to UTF-8 or set data.decode_errors=replace"
    )


def _read_folder(path: Path, data: DataSection) -> list[dict[str, Any]]:
    """A folder of class sub-folders, each holding one .txt document per example."""
    rows = []
    for label_dir in sorted(p for p in path.iterdir() if p.is_dir()):
        for doc in sorted(label_dir.glob("*.txt")):
            try:
                text = doc.read_text(encoding="utf-8", errors=data.decode_errors).strip()
            except UnicodeDecodeError:
                raise _not_utf8(doc) from None
            rows.append({data.text_column: text, data.label_column: label_dir.name})
    if not rows:
        raise InputError(f"{path}: no <label>/<doc>.txt files in this folder")
    return rows


def _read_file(path: Path, fmt: str, data: DataSection) -> list[dict[str, Any]]:
    try:
        return _parse_file(path, fmt, data)
    except UnicodeDecodeError:
        raise _not_utf8(path) from None


def _parse_file(path: Path, fmt: str, data: DataSection) -> list[dict[str, Any]]:
    with _open_text(path, data.decode_errors) as fh:
        if fmt in {"csv", "tsv"}:
            return list(csv.DictReader(fh, delimiter="\t" if fmt == "tsv" else ","))
        if fmt == "jsonl":
            rows = []
            for n, line in enumerate(fh, 1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as err:
                        raise InputError(f"{path}:{n}: not valid JSON ({err.msg})") from None
            return rows
        if fmt == "json":
            try:
                obj = json.load(fh)
            except json.JSONDecodeError as err:
                raise InputError(f"{path}:{err.lineno}: not valid JSON ({err.msg})") from None
            if isinstance(obj, dict) and "data" in obj:
                obj = obj["data"]
            if not isinstance(obj, list):
                raise InputError(f"{path}: JSON data must be a list of objects")
            return obj
        if fmt == "txt":
            # one example per blank-line-separated paragraph
            paragraphs = [p.strip() for p in fh.read().split("\n\n")]
            return [{data.text_column: p} for p in paragraphs if p]
    raise InputError(f"{path}: unsupported format {fmt}")


def _read_datasets(source: str, fmt: str, split: str, path: Path | None) -> list[dict[str, Any]]:
    import datasets  # heavy: only for parquet, saved datasets and the Hub

    try:
        if fmt == "parquet":
            ds = datasets.Dataset.from_parquet(str(path))
        elif fmt == "disk":
            ds = datasets.load_from_disk(str(path))
        else:
            ds = datasets.load_dataset(source, split=split)
    except Exception as err:  # noqa: BLE001 - datasets raises many types; report one line
        raise InputError(f"{source}: cannot load dataset ({type(err).__name__}: {err})") from None
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise InputError(f"{source}: no split '{split}' (has {', '.join(ds)})")
        ds = ds[split]
    return ds.to_list()


def read_rows(loaded: LoadedRecipe, value: str, split: str) -> list[dict[str, Any]]:
    data = loaded.recipe.data
    fmt = data.format
    if fmt == "hub" or (
        fmt == "auto" and not looks_local(value) and not loaded.resolve_path(value).exists()
    ):
        return _read_datasets(value, "hub", split, None)
    path = loaded.resolve_path(value)
    if not path.exists():
        raise InputError(f"{path}: data file not found")
    fmt = _infer_format(path) if fmt == "auto" else fmt
    if fmt in {"parquet", "disk"}:
        return _read_datasets(value, fmt, split, path)
    if fmt == "folder":
        return _read_folder(path, data)
    return _read_file(path, fmt, data)


def _check_columns(rows: list[dict[str, Any]], source: str, data: DataSection, task: Task) -> None:
    if not rows:
        raise InputError(f"{source}: no rows")
    own_columns = task.own_columns  # the task's task.*_column options, not data.*_column
    needed = task.columns(data)
    # with data.label_names given, every row's label must be one of them (checked per file, here)
    allowed = (
        dict.fromkeys(data.label_names)
        if task.needs_labels and data.label_names and not own_columns
        else None
    )
    # every row, not just the first: a later row without a column would fail mid-run
    for n, row in enumerate(rows, 1):
        if not isinstance(row, dict):
            kind = type(row).__name__
            raise InputError(f"{source}: row {n} is a {kind}, not an object of columns")
        missing = [c for c in needed if c not in row]
        if not missing and allowed is not None and str(row[data.label_column]) not in allowed:
            raise InputError(
                f"{source}: row {n}: label '{row[data.label_column]}' is not one of "
                f"data.label_names {list(allowed)}"
            )
        if missing:
            where = f"row {n}: " if n > 1 else ""
            raise InputError(
                f"{source}: {where}missing column {', '.join(missing)} "
                f"(has: {', '.join(sorted(map(str, row)))}); "
                + (
                    "set the task's column options (task.*_column)"
                    if own_columns
                    else "set data.text_column / data.label_column"
                )
            )


@dataclass
class RawSplits:
    train: list[dict[str, Any]]
    eval: list[dict[str, Any]]
    fingerprint: str  # identifies the inputs for the tokenization cache


def _fingerprint(loaded: LoadedRecipe, values: list[str | None]) -> str:
    h = hashlib.sha256()
    for value in values:
        if not value:
            continue
        h.update(value.encode())
        try:
            path = loaded.resolve_path(value)
        except Exception:  # noqa: BLE001
            continue
        files = sorted(path.rglob("*")) if path.is_dir() else [path]
        for f in files:
            if f.is_file():
                st = f.stat()
                h.update(f"{f}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def load_splits(loaded: LoadedRecipe, task: Task) -> RawSplits:
    r = loaded.recipe
    data = r.data
    train = read_rows(loaded, data.train, data.split)
    _check_columns(train, data.train, data, task)
    if data.eval:
        evals = read_rows(loaded, data.eval, data.eval_split or "validation")
        _check_columns(evals, data.eval, data, task)
    elif data.format == "hub" and data.eval_split:
        evals = read_rows(loaded, data.train, data.eval_split)
    elif data.eval_fraction > 0:
        # a seeded shuffle, then the tail is held out: the same split on every run
        order = np.random.default_rng(r.training.seed).permutation(len(train))
        n_eval = max(1, int(round(len(train) * data.eval_fraction)))
        evals = [train[i] for i in order[:n_eval]]
        train = [train[i] for i in order[n_eval:]]
    else:
        evals = []
    if data.max_train_samples:
        train = train[: data.max_train_samples]
    if data.max_eval_samples:
        evals = evals[: data.max_eval_samples]
    fp = _fingerprint(loaded, [data.train, data.eval])
    return RawSplits(train=train, eval=evals, fingerprint=fp)


def label_names(rows: list[dict[str, Any]], data: DataSection) -> list[str]:
    if data.label_names:
        return list(data.label_names)
    return sorted({str(r[data.label_column]) for r in rows})


# --------------------------------------------------------------------------- tokenize (cached)


def encode_cached(
    task: Task,
    rows: list[dict[str, Any]],
    tokenizer: Any,
    data: DataSection,
    label2id: dict[str, int] | None,
    key_parts: list[str],
) -> tuple[Encoded, bool]:
    """Tokenize rows, or load the arrays a previous run saved for identical inputs."""
    h = hashlib.sha256()
    tok_state = (
        tokenizer.backend_tokenizer.to_str()
        if hasattr(tokenizer, "backend_tokenizer")
        else repr(tokenizer)
    )
    for part in [
        str(CACHE_VERSION),
        task.name + getattr(task, "options_key", ""),
        data.model_dump_json(exclude=BATCHING_FIELDS),  # how batches are cut: not the tokens
        json.dumps(label2id),
        hashlib.sha256(tok_state.encode()).hexdigest(),
        str(len(rows)),
        *key_parts,
    ]:
        h.update(part.encode())
    path = cache_root() / "tokenized" / f"{h.hexdigest()[:24]}.npz"
    if path.exists():
        try:
            with np.load(path) as z:
                return batches.with_lengths(Encoded({k: z[k] for k in z.files})), True
        except (OSError, ValueError):
            path.unlink(missing_ok=True)  # a torn cache file: rebuild it
    encoded = batches.with_lengths(task.encode(rows, tokenizer, data, label2id))
    path.parent.mkdir(parents=True, exist_ok=True)
    with fsutil.atomic_file(path, "wb") as fh:  # a file object: np.savez adds no suffix
        np.savez(fh, **encoded.arrays)
    return encoded, False


def encode_splits(
    task: Task, raw: RawSplits, tokenizer: Any, data: DataSection, label2id: dict[str, int] | None
) -> tuple[Encoded, Encoded | None]:
    """Train and eval arrays (each from the cache when a previous run made them); logs sizes."""
    train_enc, hit = encode_cached(
        task, raw.train, tokenizer, data, label2id, [raw.fingerprint, "train"]
    )
    eval_enc = (
        encode_cached(task, raw.eval, tokenizer, data, label2id, [raw.fingerprint, "eval"])[0]
        if raw.eval
        else None
    )
    log.info(
        "data: %d train / %d eval examples of %d tokens%s",
        len(train_enc),
        len(eval_enc) if eval_enc else 0,
        data.max_length,
        " (tokenized earlier: cache hit)" if hit else "",
    )
    return train_enc, eval_enc


# --------------------------------------------------------------------------- batches
# (ortft/batches.py; these names stay here for the callers that read rows and batches together)
batches_per_epoch = batches.batches_per_epoch
train_batches = batches.train_batches
eval_batches = batches.eval_batches
