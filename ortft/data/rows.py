"""Data: read rows from files / folders / datasets into Arrow (Hugging Face ``datasets``), split.

Rows are never held in memory as Python objects: every source becomes a memory-mapped Arrow
dataset in ``<ORTFT_CACHE>/datasets`` (csv/tsv/json/jsonl/txt/folders through ortft's own
streaming readers, so quoting, UTF-8 handling and the file:line of a bad row stay exactly as
they were; parquet, saved datasets and the Hub through ``datasets`` itself). The checks each row
gets are ``ortft/data/checks.py``; a run's train and eval splits are ``ortft/data/splits.py``;
tokenizing and the tokenized cache are ``ortft/data/tokenized.py``; batches are
``ortft/data/batches.py``.
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
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from ortft.core.errors import InputError, first_line
from ortft.data.checks import RowCheck, RowColumns, check_table, needs_labels
from ortft.data.paths import looks_local, resolve_input_path
from ortft.data.spec import DataSection

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


def _iter_file_folder(path: Path, data: DataSection, column: str) -> Iterator[dict[str, Any]]:
    """A folder of class sub-folders of files (images): every file is a row, named by its
    path; hidden files (.DS_Store) are not. Whether a file is an image is the task's check."""
    found = False
    for label_dir in sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith(".")):
        for file in sorted(f for f in label_dir.iterdir() if not f.name.startswith(".")):
            if file.is_file():
                found = True
                yield {column: str(file.resolve()), data.label_column: label_dir.name}
    if not found:
        raise InputError(
            f"{path}: no <label>/<file> files in this folder, nor a metadata.jsonl or "
            "metadata.csv naming its files"
        )


# what a folder of files names its rows in (datasets' audiofolder / imagefolder convention)
METADATA = ("metadata.jsonl", "metadata.csv")


def metadata_file(folder: Path) -> Path | None:
    """The folder's metadata.jsonl / metadata.csv, if it has one."""
    return next((folder / n for n in METADATA if (folder / n).is_file()), None)


def _resolved(rows: Iterator[Any], column: str, base: Path) -> Iterator[Any]:
    """Rows whose ``column`` (a file path) is made absolute against ``base``, the folder of
    the csv/jsonl file that names it."""
    for row in rows:
        if isinstance(row, dict) and isinstance(row.get(column), str) and row[column]:
            row[column] = str((base / row[column]).expanduser().resolve())
        yield row


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
    files = check.file_column
    meta = metadata_file(path) if files and s["format"] == "folder" else None
    if meta is not None and files:  # a folder of clips (or images) named by its metadata file
        rows = _resolved(_iter_file(meta, meta.suffix.lstrip("."), data), files, path)
    elif s["format"] == "folder":
        rows = _iter_file_folder(path, data, files) if files else _iter_folder(path, data)
    else:
        rows = _iter_file(path, s["format"], data)
        rows = _resolved(rows, files, path.parent) if files else rows
    n = 0
    for n, row in enumerate(rows, 1):
        check(n, row)
        yield {c: row.get(c) for c in check.keep}
    if n == 0:
        raise InputError(f"{check.source}: no rows")


def stat_key(path: Path) -> str:
    """A digest of every file under ``path`` (or of the file): its path, size and mtime, in
    sorted order. One ``os.scandir`` walk feeding a running hash: on a folder of 100k images
    the old ``rglob`` + ``stat`` list took 2 s and 62 MB (twice a run), this walk 0.54 s and no
    list (benchmarks/image_rss.py's folder)."""
    h = hashlib.sha256()
    if path.is_file():
        st = path.stat()
        h.update(f"{path}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    elif path.is_dir():
        _hash_tree(str(path), h)
    return h.hexdigest()


def _hash_tree(folder: str, h: Any) -> None:
    with os.scandir(folder) as it:
        entries = sorted(it, key=lambda e: e.name)
    for entry in entries:
        if entry.is_dir(follow_symlinks=True):
            _hash_tree(entry.path, h)
        elif entry.is_file(follow_symlinks=True):
            st = entry.stat()
            h.update(f"{entry.path}:{st.st_size}:{st.st_mtime_ns}\n".encode())


def _from_text(path: Path, fmt: str, data: DataSection, check: RowCheck) -> Any:
    datasets = quiet_datasets()
    spec = json.dumps(
        {
            "version": READER_VERSION,
            "path": str(path),
            "format": fmt,
            "files": stat_key(path),  # a changed file is read again
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
    return f"{type(inner).__name__}: {first_line(inner)}"


def _from_datasets(
    source: str, fmt: str, split: str, path: Path | None, of_splits: bool = False
) -> Any:
    """The ``split`` of a parquet file, a saved ``datasets`` folder or a Hub dataset (a saved
    Dataset or a parquet file is one split, whatever ``split`` says, unless ``of_splits``)."""
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
    elif of_splits and fmt != "hub":  # the Hub gave the split asked for
        raise _no_splits(source, split, "a saved Dataset" if fmt == "disk" else f"a {fmt} file")
    return ds


def _no_splits(source: str, split: str, what: str) -> InputError:
    return InputError(
        f"{source}: data.eval_split '{split}' names a split, but {what} has none (a saved "
        "DatasetDict or a Hub dataset has); give data.eval or data.eval_fraction instead"
    )


def read_rows(
    spec: DataSection,
    base_dir: Path,
    value: str,
    split: str,
    task: RowColumns,
    of_splits: bool = False,
) -> Rows:
    """One source's rows, checked, as a memory-mapped Arrow dataset (``value``: a path, relative
    to ``base_dir``, or a Hub name). ``of_splits``: ``split`` must be one of the source's own
    splits (``data.eval_split``), never the whole of a source that has none."""
    fmt: str = spec.format
    if fmt == "hub" or (
        fmt == "auto"
        and not looks_local(value)
        and not resolve_input_path(value, base_dir).exists()
    ):
        ds = _from_datasets(value, "hub", split, None, of_splits)
        check_table(ds, RowCheck.of(value, spec, task))
        return Rows(ds)
    path = resolve_input_path(value, base_dir)
    if not path.exists():
        raise InputError(f"{path}: data file not found")
    fmt = _infer_format(path) if fmt == "auto" else fmt
    check = RowCheck.of(value, spec, task)
    if fmt in {"parquet", "disk"}:
        ds = _from_datasets(value, fmt, split, path, of_splits)
        check_table(ds, check)
        return Rows(ds)
    if of_splits:
        raise _no_splits(value, split, "a folder" if fmt == "folder" else f"a {fmt} file")
    return Rows(_from_text(path, fmt, spec, check))


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

    def origin(self) -> Any:
        """Each row's 0-based row in its source where a selection picked them (data.eval_fraction's
        shuffle, data.max_*_samples, a sample), as a numpy array; None: the source's own order.
        (datasets keeps a selection as an index mapping over the unchanged table.)"""
        indices = self.dataset._indices
        return None if indices is None else indices.column(0).to_numpy()

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


@runtime_checkable
class NamesLabels(Protocol):
    """A task whose label names are not the values of data.label_column (token
    classification: the tags of its words)."""

    def label_names(self, rows: Any, data: DataSection) -> list[str]:
        """The label names in id order."""
        ...


def labels_of(task: object, rows: Any, data: DataSection) -> list[str] | None:
    """``task``'s label names in id order (``NamesLabels``; by default data.label_names, or
    the sorted values of data.label_column); None for a task without labels."""
    if isinstance(task, NamesLabels):
        return task.label_names(rows, data)
    return label_names(rows, data) if needs_labels(task) else None


def label_names(rows: Any, data: DataSection) -> list[str]:
    if data.label_names:
        return list(data.label_names)
    if isinstance(rows, Rows):  # Arrow's unique: no pass over the rows in Python
        return sorted({str(v) for v in rows.dataset.unique(data.label_column)})
    return sorted({str(r[data.label_column]) for r in rows})
