"""Data: read rows from files / folders / datasets into Arrow (Hugging Face ``datasets``), split.

Rows are never held in memory as Python objects: every source becomes a memory-mapped Arrow
dataset in ``<ORTFT_CACHE>/datasets`` (csv/tsv/json/jsonl/txt/folders through ortft's own
streaming readers, so quoting, UTF-8 handling and the file:line of a bad row stay exactly as
they were; parquet, saved datasets and the Hub through ``datasets`` itself). Tokenizing and the
tokenized cache are ``ortft/data/tokenized.py``; batches are ``ortft/data/batches.py``.
"""

from __future__ import annotations

import bz2
import codecs
import csv
import gzip
import hashlib
import io
import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ortft.core.errors import InputError
from ortft.data import batches
from ortft.recipe.io import LoadedRecipe, looks_local
from ortft.recipe.schema import DataSection
from ortft.tasks import Task

log = logging.getLogger("ortft")

# bump when what a reader yields changes: part of the Arrow cache key of every text source
READER_VERSION = 2
CHUNK = 1 << 20  # streaming readers read 1 MiB at a time
# rows per Arrow record batch of a source's rows (see tokenized.ROW_BATCH: fewer pages touched)
WRITER_BATCH = 10_000


def cache_root() -> Path:
    return Path(os.environ.get("ORTFT_CACHE", Path.home() / ".cache" / "ortft"))


def quiet_datasets() -> Any:
    """``datasets``, imported with its progress bars and info logs off (ortft logs its own)."""
    import datasets

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    return datasets


# --------------------------------------------------------------------------- text sources


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


def _open_binary(path: Path) -> Any:
    name = path.name.lower()
    if name.endswith(".bz2"):
        return bz2.open(path, "rb")
    return gzip.open(path, "rb") if name.endswith(".gz") else open(path, "rb")


def _open_text(path: Path, errors: str) -> io.TextIOBase:
    # utf-8-sig: a byte-order mark (common in spreadsheet exports) must not become part of
    # the first column's name
    name = path.name.lower()
    if name.endswith((".bz2", ".gz")):
        return io.TextIOWrapper(_open_binary(path), encoding="utf-8-sig", errors=errors)
    return open(path, encoding="utf-8-sig", errors=errors, newline="")


def _not_utf8(path: Path) -> InputError:
    """Strict decoding, never silent U+FFFD: name the file and the line of the first bad byte
    (read in 1 MiB chunks, so a large file is never loaded whole)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    line, offset = 1, 0
    with _open_binary(path) as fh:
        while chunk := fh.read(CHUNK):
            try:
                decoder.decode(chunk)
            except UnicodeDecodeError as err:
                # the error's position is within this chunk plus what the decoder held back
                held = len(err.object) - len(chunk)
                at = max(err.start - held, 0)
                line += chunk.count(b"\n", 0, at)
                return InputError(
                    f"{path}:{line}: not UTF-8 text (byte 0x{err.object[err.start]:02x}); "
                    "convert the file to UTF-8 or set data.decode_errors=replace"
                )
            line += chunk.count(b"\n")
            offset += len(chunk)
    return InputError(
        f"{path}: not UTF-8 text; convert the file to UTF-8 or set data.decode_errors=replace"
    )


def _iter_folder(path: Path, data: DataSection) -> Iterator[dict[str, Any]]:
    """A folder of class sub-folders, each holding one .txt document per example."""
    found = False
    for label_dir in sorted(p for p in path.iterdir() if p.is_dir()):
        for doc in sorted(label_dir.glob("*.txt")):
            try:
                text = doc.read_text(encoding="utf-8", errors=data.decode_errors).strip()
            except UnicodeDecodeError:
                raise _not_utf8(doc) from None
            found = True
            yield {data.text_column: text, data.label_column: label_dir.name}
    if not found:
        raise InputError(f"{path}: no <label>/<doc>.txt files in this folder")


def _paragraphs(fh: io.TextIOBase) -> Iterator[str]:
    """``fh.read().split("\\n\\n")``, stripped and without empty ones, read 1 MiB at a time."""
    rest = ""
    while chunk := fh.read(CHUNK):
        *done, rest = (rest + chunk).split("\n\n")
        yield from (p.strip() for p in done if p.strip())
    if rest.strip():
        yield rest.strip()


def _iter_jsonl(fh: io.TextIOBase, path: Path) -> Iterator[Any]:
    for n, line in enumerate(fh, 1):
        if line.strip():
            try:
                yield json.loads(line)
            except json.JSONDecodeError as err:
                raise InputError(f"{path}:{n}: not valid JSON ({err.msg})") from None


def _iter_json(fh: io.TextIOBase, path: Path) -> Iterator[Any]:
    # one JSON document is parsed whole; jsonl is the format for data bigger than memory
    try:
        obj = json.load(fh)
    except json.JSONDecodeError as err:
        raise InputError(f"{path}:{err.lineno}: not valid JSON ({err.msg})") from None
    if isinstance(obj, dict) and "data" in obj:
        obj = obj["data"]
    if not isinstance(obj, list):
        raise InputError(f"{path}: JSON data must be a list of objects")
    yield from obj


def _iter_file(path: Path, fmt: str, data: DataSection) -> Iterator[Any]:
    """The rows of a text file, one at a time."""
    try:
        with _open_text(path, data.decode_errors) as fh:
            if fmt in {"csv", "tsv"}:
                yield from csv.DictReader(fh, delimiter="\t" if fmt == "tsv" else ",")
            elif fmt == "jsonl":
                yield from _iter_jsonl(fh, path)
            elif fmt == "json":
                yield from _iter_json(fh, path)
            elif fmt == "txt":  # one example per blank-line-separated paragraph
                yield from ({data.text_column: p} for p in _paragraphs(fh))
            else:
                raise InputError(f"{path}: unsupported format {fmt}")
    except UnicodeDecodeError:
        raise _not_utf8(path) from None


def _read_file(path: Path, fmt: str, data: DataSection) -> list[dict[str, Any]]:
    """All rows of a text file as a list (small files: tests, ``ortft eval --data``)."""
    return list(_iter_file(path, fmt, data))


# --------------------------------------------------------------------------- row checks


@dataclass(frozen=True)
class RowCheck:
    """What every row of a source must hold, checked as the rows stream past (a later row
    without a column would otherwise fail mid-run)."""

    source: str
    needed: tuple[str, ...]  # columns every row must have (a null counts as missing)
    keep: tuple[str, ...]  # the columns the task reads: what is stored in Arrow
    label_column: str | None = None  # with allowed: the column checked against it
    allowed: tuple[str, ...] | None = None  # data.label_names, when given
    hint: str = "set data.text_column / data.label_column"

    @classmethod
    def of(cls, source: str, data: DataSection, task: Task) -> RowCheck:
        own = task.own_columns  # the task's task.*_column options, not data.*_column
        allowed = (
            tuple(data.label_names) if task.needs_labels and data.label_names and not own else None
        )
        needed = tuple(task.columns(data))
        return cls(
            source=source,
            needed=needed,
            keep=tuple(dict.fromkeys([*needed, *task.read_columns(data)])),
            label_column=data.label_column if allowed else None,
            allowed=allowed,
            hint="set the task's column options (task.*_column)" if own else cls.hint,
        )

    def __call__(self, n: int, row: Any) -> None:
        if not isinstance(row, dict):
            kind = type(row).__name__
            raise InputError(f"{self.source}: row {n} is a {kind}, not an object of columns")
        missing = [c for c in self.needed if row.get(c) is None]
        if missing:
            where = f"row {n}: " if n > 1 else ""
            has = ", ".join(sorted(str(k) for k, v in row.items() if v is not None))
            raise InputError(
                f"{self.source}: {where}missing column {', '.join(missing)} (has: {has}); "
                + self.hint
            )
        if self.allowed is not None and str(row[self.label_column]) not in self.allowed:
            raise InputError(
                f"{self.source}: row {n}: label '{row[self.label_column]}' is not one of "
                f"data.label_names {list(self.allowed)}"
            )


def _check_columns(rows: list[dict[str, Any]], source: str, data: DataSection, task: Task) -> None:
    """Check rows already in memory (``ortft eval --data``)."""
    if not rows:
        raise InputError(f"{source}: no rows")
    check = RowCheck.of(source, data, task)
    for n, row in enumerate(rows, 1):
        check(n, row)


def _check_table(ds: Any, check: RowCheck) -> None:
    """The same checks on an Arrow dataset (parquet, saved datasets, the Hub), column-wise."""
    import pyarrow.compute as pc

    if len(ds) == 0:
        raise InputError(f"{check.source}: no rows")
    absent = [c for c in check.needed if c not in ds.column_names]
    if absent:
        raise InputError(
            f"{check.source}: missing column {', '.join(absent)} "
            f"(has: {', '.join(sorted(ds.column_names))}); {check.hint}"
        )
    table = ds.with_format("arrow")[:]  # a view of the memory-mapped table (no copy)
    for c in check.needed:
        nulls = pc.is_null(table[c])
        if pc.any(nulls).as_py():
            check(int(pc.index(nulls, True).as_py()) + 1, {c: None})
    if check.allowed is not None:
        labels = pc.cast(table[check.label_column], "string")
        outside = pc.invert(pc.is_in(labels, value_set=pc.cast(list(check.allowed), "string")))
        if pc.any(outside).as_py():
            n = int(pc.index(outside, True).as_py())
            check(n + 1, {**dict.fromkeys(check.needed, ""), check.label_column: labels[n].as_py()})


# --------------------------------------------------------------------------- rows in Arrow


def _generate(spec: str) -> Iterator[dict[str, Any]]:
    """``Dataset.from_generator``'s generator: the checked rows of one text source, projected
    on the columns the task reads (``spec``: JSON, part of the Arrow cache key)."""
    s = json.loads(spec)
    path, data = Path(s["path"]), DataSection.model_validate(s["data"])
    fields: dict[str, Any] = {
        k: tuple(v) if isinstance(v, list) else v for k, v in s["check"].items()
    }
    check = RowCheck(**fields)
    rows = (
        _iter_folder(path, data) if s["format"] == "folder" else _iter_file(path, s["format"], data)
    )
    n = 0
    for n, row in enumerate(rows, 1):
        check(n, row)
        yield {c: row.get(c) for c in check.keep}
    if n == 0:
        raise InputError(f"{check.source}: no rows")


def _stat_key(path: Path) -> list[str]:
    files = sorted(path.rglob("*")) if path.is_dir() else [path]
    return [f"{f}:{f.stat().st_size}:{f.stat().st_mtime_ns}" for f in files if f.is_file()]


def _from_text(path: Path, fmt: str, data: DataSection, check: RowCheck) -> Any:
    datasets = quiet_datasets()
    spec = json.dumps(
        {
            "version": READER_VERSION,
            "path": str(path),
            "format": fmt,
            "files": _stat_key(path),  # a changed file is read again
            "data": data.model_dump(mode="json"),
            "check": {k: getattr(check, k) for k in check.__dataclass_fields__},
        },
        sort_keys=True,
    )
    try:
        return datasets.Dataset.from_generator(
            _generate,
            gen_kwargs={"spec": spec},
            cache_dir=str(cache_root() / "datasets"),
            writer_batch_size=WRITER_BATCH,
            # the key of the Arrow copy: what is read, how (READER_VERSION), the files' sizes
            # and mtimes. Given, it spares datasets hashing _generate's module by value (which
            # imports torch whenever it is in sys.modules)
            fingerprint=hashlib.sha256(spec.encode()).hexdigest()[:16],
        )
    except Exception as err:  # noqa: BLE001 - datasets wraps the generator's own error
        cause: BaseException | None = err
        while cause is not None and not isinstance(cause, InputError):
            cause = cause.__cause__ or cause.__context__
        if cause is not None:
            raise cause from None
        raise InputError(f"{path}: cannot store the rows in Arrow ({_one_line(err)})") from None


def _one_line(err: BaseException) -> str:
    inner = err.__cause__ or err
    return f"{type(inner).__name__}: {str(inner).splitlines()[0] if str(inner) else ''}"


def _from_datasets(source: str, fmt: str, split: str, path: Path | None) -> Any:
    datasets = quiet_datasets()
    cache_dir = str(cache_root() / "datasets")
    try:
        if fmt == "parquet":
            ds = datasets.Dataset.from_parquet(str(path), cache_dir=cache_dir)
        elif fmt == "disk":
            ds = datasets.load_from_disk(str(path))
        else:  # the Hub's own cache (~/.cache/huggingface): where offline copies already are
            ds = datasets.load_dataset(source, split=split)
    except Exception as err:  # noqa: BLE001 - datasets raises many types; report one line
        raise InputError(f"{source}: cannot load dataset ({type(err).__name__}: {err})") from None
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise InputError(f"{source}: no split '{split}' (has {', '.join(ds)})")
        ds = ds[split]
    return ds


def read_rows(loaded: LoadedRecipe, value: str, split: str, task: Task) -> Rows:
    """One source's rows, checked, as a memory-mapped Arrow dataset."""
    data = loaded.recipe.data
    fmt: str = data.format
    if fmt == "hub" or (
        fmt == "auto" and not looks_local(value) and not loaded.resolve_path(value).exists()
    ):
        ds = _from_datasets(value, "hub", split, None)
        _check_table(ds, RowCheck.of(value, data, task))
        return Rows(ds)
    path = loaded.resolve_path(value)
    if not path.exists():
        raise InputError(f"{path}: data file not found")
    fmt = _infer_format(path) if fmt == "auto" else fmt
    check = RowCheck.of(value, data, task)
    if fmt in {"parquet", "disk"}:
        ds = _from_datasets(value, fmt, split, path)
        _check_table(ds, check)
        return Rows(ds)
    return Rows(_from_text(path, fmt, data, check))


class Rows:
    """A split's rows: an Arrow dataset that reads like a list of dicts (a null value is a
    missing key, as in the source row). Iterating reads 1000 rows at a time."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for batch in self.dataset.iter(batch_size=1000):
            yield from as_dicts(batch)

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return as_dicts(self.dataset[index])
        return as_dicts({k: [v] for k, v in self.dataset[index].items()})[0]

    def select(self, index: Any) -> Rows:
        return Rows(self.dataset.select(index))

    @property
    def fingerprint(self) -> str:
        return self.dataset._fingerprint


def as_dicts(batch: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """A column batch as row dicts, without the nulls Arrow filled in for absent keys."""
    keys = list(batch)
    return [
        {k: v for k, v in zip(keys, values, strict=True) if v is not None}
        for values in zip(*batch.values(), strict=True)
    ]


@dataclass
class RawSplits:
    train: Any  # Rows, or streaming.StreamRows (data.streaming)
    eval: Rows | None
    fingerprint: str  # identifies the input files for the tokenization cache


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
        if path.exists():
            h.update("\n".join(_stat_key(path)).encode())
    return h.hexdigest()[:16]


def load_splits(loaded: LoadedRecipe, task: Task) -> RawSplits:
    r = loaded.recipe
    data = r.data
    if data.streaming:  # train rows read as they stream (ortft/data/streaming.py); eval stored
        return _stream_splits(loaded, task)
    train = read_rows(loaded, data.train, data.split, task)
    evals: Rows | None = None
    if data.eval:
        evals = read_rows(loaded, data.eval, data.eval_split or "validation", task)
    elif data.format == "hub" and data.eval_split:
        evals = read_rows(loaded, data.train, data.eval_split, task)
    elif data.eval_fraction > 0:
        # a seeded shuffle, then the tail is held out: the same split on every run
        order = np.random.default_rng(r.training.seed).permutation(len(train))
        n_eval = max(1, int(round(len(train) * data.eval_fraction)))
        evals, train = train.select(order[:n_eval]), train.select(order[n_eval:])
    if data.max_train_samples and data.max_train_samples < len(train):
        train = train.select(range(data.max_train_samples))
    if evals is not None and data.max_eval_samples and data.max_eval_samples < len(evals):
        evals = evals.select(range(data.max_eval_samples))
    fp = _fingerprint(loaded, [data.train, data.eval])
    return RawSplits(train=train, eval=evals or None, fingerprint=fp)


def _stream_splits(loaded: LoadedRecipe, task: Task) -> RawSplits:
    from ortft.data import streaming

    data = loaded.recipe.data
    train: Any = streaming.read(loaded, data.train, data.split, task)
    if data.max_train_samples:
        train.dataset = train.dataset.take(data.max_train_samples)
    evals = None
    if data.eval:
        evals = read_rows(loaded, data.eval, data.eval_split or "validation", task)
    elif data.format == "hub" and data.eval_split:
        evals = read_rows(loaded, data.train, data.eval_split, task)
    if evals is not None and data.max_eval_samples and data.max_eval_samples < len(evals):
        evals = evals.select(range(data.max_eval_samples))
    return RawSplits(train=train, eval=evals, fingerprint=_fingerprint(loaded, [data.eval]))


def label_names(rows: Any, data: DataSection) -> list[str]:
    if data.label_names:
        return list(data.label_names)
    if isinstance(rows, Rows):  # Arrow's unique: no pass over the rows in Python
        return sorted({str(v) for v in rows.dataset.unique(data.label_column)})
    return sorted({str(r[data.label_column]) for r in rows})


# --------------------------------------------------------------------------- batches
# (ortft/data/batches.py; these names stay here for the callers that read rows and batches together)
batches_per_epoch = batches.batches_per_epoch
train_batches = batches.train_batches
eval_batches = batches.eval_batches
