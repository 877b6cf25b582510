"""``data.streaming: true``: train rows read, shuffled and tokenized as they stream, never stored.

The rows come from a ``datasets.IterableDataset`` (ortft's own readers for text files, so a bad
row still names its file and line; ``datasets`` for parquet and the Hub), shuffled with a
bounded buffer (``IterableDataset.shuffle(seed, data.shuffle_buffer)``, re-seeded each epoch
with ``set_epoch``) and tokenized a chunk at a time. What works as with stored data:

- ``data.padding`` (longest, buckets, max_length): it cuts each batch on its own;
- ``data.group_by_length``: a bounded buffer of 50 batches' rows is sorted by length, as each
  group of the stored order is (the stored order's groups are cut from a full permutation);
- exact resume: the stream is read again from the start of the run, deterministically, and
  the micro-batches already trained are skipped; whole skipped chunks are not tokenized.

What a stream cannot do is a recipe error (``rules.streaming``): epochs (training.max_steps is
required), a held-out fraction (give data.eval, read in full), label names found by reading all
rows (give data.label_names), tasks that tokenize across rows (packing, masked-lm's row ids),
and backend auto / ort-ondevice. Under torchrun each process reads the stream and trains its
slice of every global batch.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ortft.core.errors import InputError
from ortft.data import batches, tokenized
from ortft.data import rows as data
from ortft.data.checks import RowCheck, RowColumns
from ortft.data.encoded import Encoded, Encoder
from ortft.data.paths import looks_local, resolve_input_path
from ortft.data.spec import DataSection


class StreamRows:
    """A split's rows as a stream (iterating reads the source again)."""

    def __init__(self, dataset: Any, check: RowCheck) -> None:
        self.dataset, self.check = dataset, check

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for batch in self.dataset.iter(batch_size=tokenized.ROW_BATCH):
            yield from data.as_dicts(batch)


def read(spec: DataSection, base_dir: Path, value: str, split: str, task: RowColumns) -> StreamRows:
    """One source's rows as a stream, each checked as it is read (``value``: a path, relative
    to ``base_dir``, or a Hub name)."""
    datasets = data.quiet_datasets()
    check = RowCheck.of(value, spec, task)
    local = spec.format != "hub" and (
        looks_local(value) or resolve_input_path(value, base_dir).exists()
    )
    if not local:
        return StreamRows(datasets.load_dataset(value, split=split, streaming=True), check)
    path = resolve_input_path(value, base_dir)
    if not path.exists():
        raise InputError(f"{path}: data file not found")
    fmt = data._infer_format(path) if spec.format == "auto" else spec.format
    if fmt == "parquet":
        ds = datasets.load_dataset("parquet", data_files=str(path), split="train", streaming=True)
    elif fmt == "disk":  # a saved DatasetDict streams its data.split
        ds = data._from_datasets(value, fmt, split, path).to_iterable_dataset()
    else:
        payload = {
            "path": str(path),
            "format": fmt,
            "data": spec.model_dump(mode="json"),
            "check": {k: getattr(check, k) for k in check.__dataclass_fields__},
        }
        ds = datasets.IterableDataset.from_generator(
            data._generate, gen_kwargs={"spec": json.dumps(payload)}
        )
    return StreamRows(ds, check)


class StreamEncoded(Encoded):
    """Tokenized train rows of a stream: no length; batches through ``train_batches``."""

    def __init__(
        self, rows: StreamRows, task: Encoder, tokenizer: Any, spec: DataSection, label2id: Any
    ) -> None:
        self.rows, self.task, self.tokenizer, self.spec = rows, task, tokenizer, spec
        self.label2id = label2id
        self.arrays = {}
        self.seen = 0  # rows read so far (for error messages)

    def __len__(self) -> int:
        raise TypeError("a stream has no length (data.streaming)")

    def encode(self, chunk: dict[str, list[Any]]) -> dict[str, np.ndarray]:
        rows = data.as_dicts(chunk)
        for n, row in enumerate(rows, self.seen + 1):
            self.rows.check(n, row)
        indices = list(range(self.seen, self.seen + len(rows)))
        self.seen += len(rows)
        # rows numbered as read (a shuffled stream's order: its buffer picks no file row)
        out = tokenized._encode_batch(
            chunk,
            indices,
            self.task,
            self.tokenizer,
            self.spec,
            self.label2id,
            self.rows.check.source,
            None,
        )
        return {
            k: v.astype(np.int64) if k in tokenized.MODEL_COLUMNS else v for k, v in out.items()
        }

    def take(self, index: np.ndarray) -> dict[str, np.ndarray]:
        """Rows by position in the unshuffled stream (the export's parity samples)."""
        need = int(np.max(index)) + 1
        chunk = next(iter(self.rows.dataset.iter(batch_size=need)))
        return {k: v[np.asarray(index)] for k, v in self.encode(chunk).items()}

    def train_batches(
        self,
        batch_size: int,
        seed: int,
        shuffle: bool,
        start_micro: int = 0,
        group_by_length: bool = False,
    ) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
        """(epoch, batch) forever, as ``batches.train_batches`` does for stored rows."""
        # a chunk is tokenized in one call: whole batches, 50 of them when grouped by length
        per_chunk = (
            batches.GROUP_BATCHES if group_by_length else max(1, tokenized.ROW_BATCH // batch_size)
        )
        size = batch_size * per_chunk
        ds = self.rows.dataset
        if shuffle:
            ds = ds.shuffle(seed=seed, buffer_size=self.spec.shuffle_buffer)
        micro, epoch = 0, 0
        while True:
            ds.set_epoch(epoch)  # the shuffle buffer's seed is seed + epoch
            self.seen, before = 0, micro
            for chunk in ds.iter(batch_size=size):
                read = len(next(iter(chunk.values())))
                n = read // batch_size
                if micro + n <= start_micro:  # already trained: skipped without tokenizing
                    micro, self.seen = micro + n, self.seen + read
                    continue
                arrays = self.encode(chunk)
                order = np.arange(len(arrays["input_ids"]))
                if group_by_length:  # longest first; stable, as the stored order's groups
                    order = np.argsort(-arrays[batches.LENGTH], kind="stable")
                for b in range(n):
                    if micro >= start_micro:
                        rows = order[b * batch_size : (b + 1) * batch_size]
                        yield epoch, {k: v[rows] for k, v in arrays.items()}
                    micro += 1
            if micro == before:
                raise InputError(f"data.train: the stream makes no batch of {batch_size} rows")
            epoch += 1


def is_stream(encoded: Any) -> bool:
    return isinstance(encoded, StreamEncoded)
