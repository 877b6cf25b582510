"""The tokenized cache: rows -> token arrays through ``datasets.map``, stored as Arrow files in
``<ORTFT_CACHE>/tokenized/<key>/`` and read back memory-mapped (``ortft cache`` lists and
prunes the entries).

The key hashes everything that changes the tokens (the rows' fingerprint, the tokenizer, the
task and its options, the data section except how batches are cut, the label ids), so a second
run with the same inputs reads the arrays instead of tokenizing. The columns the model reads
are stored as int32 (ids fit: vocabularies are far below 2**31) and served as int64; each row's
real length is stored with them (``_length``) for length-aware batching. An entry is built in a
temp folder and renamed into place, under a file lock: under torchrun the first process
tokenizes and the others wait for it, then read the same files.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ortft.core import fsutil
from ortft.core.errors import InputError
from ortft.data import batches, checks
from ortft.data import rows as data
from ortft.data.encoded import Encoded, Encoder, row_local
from ortft.data.spec import DataSection

CACHE_VERSION = 2  # 1: .npz of int64 arrays; 2: Arrow files, int32 model columns
META = "ortft-cache.json"  # written last: an entry without it is incomplete
# data fields that change how batches are cut or how tokenizing runs, not the tokens
NOT_IN_KEY = {
    "padding",
    "pad_to_multiple_of",
    "buckets",
    "group_by_length",
    "shuffle",
    "num_proc",
    "streaming",
    "shuffle_buffer",
}
MODEL_COLUMNS = ("input_ids", "attention_mask", "token_type_ids", "labels")
INT32 = np.iinfo(np.int32)
HELD_OUT = " (held out)"  # the source of data.eval_fraction's rows: data.train's file
# rows per datasets.map batch, and so per Arrow record batch of an entry: opening an entry and
# reading its _length column touch every record batch, and each touch maps 64 KB of the file
# (the kernel's fault-around), so 1000-row batches put ~64 MB more per 1M rows in RSS than these
ROW_BATCH = 10_000


def root() -> Path:
    return data.cache_root() / "tokenized"


class ArrowEncoded(Encoded):
    """Tokenized rows in memory-mapped Arrow files: ``take`` reads only the rows it is asked
    for. In memory: the per-row lengths (``arrays[_length]``, 4 bytes a row)."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset
        self._table = dataset.with_format("arrow")
        lengths = self._table[batches.LENGTH] if len(dataset) else []
        self.arrays = {batches.LENGTH: _column(lengths, len(dataset))}

    def __len__(self) -> int:
        return len(self.dataset)

    def column(self, name: str) -> np.ndarray:
        """One column, every row (read from the memory-mapped files)."""
        return _column(self._table[name], len(self.dataset))

    def take(self, index: np.ndarray) -> dict[str, np.ndarray]:
        table = self._table[np.asarray(index, dtype=np.int64)]
        out = {}
        for name in table.column_names:
            values = _column(table[name], len(table))
            out[name] = values.astype(np.int64) if name in MODEL_COLUMNS else values
        return out


def _column(col: Any, n: int) -> np.ndarray:
    """An Arrow column of (nested, rectangular) lists as one numpy array."""
    import pyarrow as pa

    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    shape = [n]
    while pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type):
        flat = arr.flatten()
        shape.append(len(flat) // max(len(arr), 1))
        arr = flat
    if pa.types.is_binary(arr.type) or pa.types.is_string(arr.type):
        return np.array(arr.to_pylist(), dtype="S").reshape(shape)  # fixed-width, as encoded
    return arr.to_numpy(zero_copy_only=False).reshape(shape)


def _encode_batch(
    batch: dict[str, list[Any]],
    indices: list[int],
    task: Encoder,
    tokenizer: Any,
    spec: DataSection,
    label2id: dict[str, int] | None,
    source: str,
    origin: np.ndarray | None,
) -> dict[str, np.ndarray]:
    """``datasets.map``'s function: one batch of rows -> its arrays (model columns int32)."""
    try:
        enc = task.encode(data.as_dicts(batch), tokenizer, spec, label2id)
    except InputError as err:  # a task numbers rows within its batch: name the file's row
        first = indices[0] if indices else 0
        raise checks.at_source(err, source.removesuffix(HELD_OUT), origin, first) from None
    out = {}
    for name, values in batches.with_lengths(enc).arrays.items():
        if name in MODEL_COLUMNS and values.dtype == np.int64:
            if values.size and (values.min() < INT32.min or values.max() > INT32.max):
                raise InputError(f"{name}: values beyond int32 ({values.min()}..{values.max()})")
            values = values.astype(np.int32)
        out[name] = values
    return out


def key(
    task: Encoder,
    rows: data.Rows,
    tokenizer: Any,
    spec: DataSection,
    label2id: Any,
    parts: list[str],
) -> str:
    tok_state = (
        tokenizer.backend_tokenizer.to_str()
        if hasattr(tokenizer, "backend_tokenizer")
        else repr(tokenizer)
    )
    tok_state += repr(getattr(tokenizer, "model_input_names", None))  # which arrays it gives
    h = hashlib.sha256()
    for part in [
        str(CACHE_VERSION),
        task.name + getattr(task, "options_key", ""),
        spec.model_dump_json(exclude=NOT_IN_KEY),
        json.dumps(label2id),
        hashlib.sha256(tok_state.encode()).hexdigest(),
        rows.fingerprint,  # the rows and their selection (eval_fraction, max_*_samples)
        *parts,
    ]:
        h.update(part.encode())
    return h.hexdigest()[:24]


def _build(
    tmp: Path,
    name: str,
    task: Encoder,
    rows: data.Rows,
    tokenizer: Any,
    spec: DataSection,
    label2id: Any,
    source: str,
) -> dict[str, Any]:
    """Tokenize ``rows`` into ``tmp`` (the entry ``name`` being made); the entry's meta."""
    t0 = time.perf_counter()
    num_proc = spec.num_proc if spec.num_proc > 1 else None
    rows.dataset.map(
        _encode_batch,
        with_indices=True,
        batched=True,
        # a task whose encode looks across rows (packing, masking ids) gets them all at once
        batch_size=ROW_BATCH if row_local(task) else None,
        remove_columns=rows.dataset.column_names,
        fn_kwargs={
            "task": task,
            "tokenizer": tokenizer,
            "spec": spec,
            "label2id": label2id,
            "source": source,
            "origin": rows.origin(),
        },
        num_proc=num_proc if row_local(task) else None,
        cache_file_name=str(tmp / "data.arrow"),
        load_from_cache_file=False,
        new_fingerprint=name,
    )
    return {
        "version": CACHE_VERSION,
        "source": source,
        "task": task.name,
        "rows": len(rows),
        "files": sorted(p.name for p in tmp.glob("data*.arrow")),
        "created": time.time(),
        "tokenize_s": round(time.perf_counter() - t0, 3),
    }


def make_once(entry: Path, build: Callable[[Path], dict[str, Any]]) -> bool:
    """Make the cache entry ``entry`` once, whichever process asks first: ``build(tmp)`` writes
    its files into a temporary folder and returns its meta, written last (``META``), then the
    folder takes the entry's name. True when the entry was there already."""
    from filelock import FileLock  # datasets' own dependency

    entry.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(entry) + ".lock"):
        if (entry / META).exists():
            return True
        with fsutil.atomic_dir(entry, fsync=False) as tmp:
            meta = build(tmp)
            (tmp / META).write_text(json.dumps(meta, indent=2))
    return False


def _load(entry: Path) -> ArrowEncoded:
    datasets = data.quiet_datasets()
    meta = json.loads((entry / META).read_text())
    parts = [datasets.Dataset.from_file(str(entry / f)) for f in meta["files"]]
    return ArrowEncoded(datasets.concatenate_datasets(parts) if len(parts) > 1 else parts[0])


def encode(
    task: Encoder,
    rows: data.Rows,
    tokenizer: Any,
    spec: DataSection,
    label2id: dict[str, int] | None,
    parts: list[str],
    source: str,
) -> tuple[ArrowEncoded, bool]:
    """Tokenize ``rows``, or read the arrays a previous run (or another process) made."""
    entry = root() / key(task, rows, tokenizer, spec, label2id, parts)
    hit = make_once(
        entry, lambda tmp: _build(tmp, entry.name, task, rows, tokenizer, spec, label2id, source)
    )
    try:
        return _load(entry), hit
    except (OSError, ValueError, KeyError) as err:
        raise InputError(
            f"{entry}: a damaged tokenized cache entry ({err}); remove it with "
            f"`ortft cache prune --all` or delete the folder"
        ) from None
