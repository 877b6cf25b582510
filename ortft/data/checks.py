"""Row checks: what every row of a source must hold (its columns; its label, when
``data.label_names`` is given), checked as the rows stream past or column-wise on an Arrow table.

Which columns those are comes from the task, through the small protocols below, each read
through the function beside it that gives the default for a task without it: most tasks read
``data.text_column`` (with ``data.text_pair_column``, and ``data.label_column`` when they have
labels). Data never imports ``ortft.tasks``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias, runtime_checkable

from ortft.core.errors import InputError
from ortft.data.spec import DataSection

# A task, as the row checks see it: any object, asked through the protocols below.
RowColumns: TypeAlias = object


@runtime_checkable
class HasLabels(Protocol):
    """A task whose rows carry labels (data.label_column), one per row or per word (sequence,
    token and image classification), checked against data.label_names."""

    @property
    def needs_labels(self) -> bool: ...


def needs_labels(task: object) -> bool:
    """Whether ``task``'s rows carry labels (``HasLabels``); False."""
    return isinstance(task, HasLabels) and task.needs_labels


@runtime_checkable
class OwnColumns(Protocol):
    """A task whose rows are read through its own column options (task.*_column), not data.*
    (token classification, question answering, seq2seq, instruction, sentence embedding)."""

    @property
    def own_columns(self) -> bool: ...


def own_columns(task: object) -> bool:
    """Whether ``task`` names its own columns (``OwnColumns``); False."""
    return isinstance(task, OwnColumns) and task.own_columns


@runtime_checkable
class ReadsColumns(Protocol):
    """A task whose rows hold other columns than data.text_column (+ pair, + label)."""

    def columns(self, data: DataSection) -> list[str]:
        """The columns every row must have."""
        ...


def columns(task: object, data: DataSection) -> list[str]:
    """The columns every row of ``task`` must have (``ReadsColumns``); by default
    data.text_column, data.text_pair_column when set, data.label_column with labels."""
    if isinstance(task, ReadsColumns):
        return task.columns(data)
    needed = [data.text_column]
    if data.text_pair_column:
        needed.append(data.text_pair_column)
    if needs_labels(task):
        needed.append(data.label_column)
    return needed


@runtime_checkable
class KeepsColumns(Protocol):
    """A task whose encode() reads columns that rows need not have (instruction's optional
    input column)."""

    def read_columns(self, data: DataSection) -> list[str]:
        """The columns encode() reads (what is kept of each row)."""
        ...


def read_columns(task: object, data: DataSection) -> list[str]:
    """The columns ``task``'s encode() reads (``KeepsColumns``); by default ``columns``."""
    return task.read_columns(data) if isinstance(task, KeepsColumns) else columns(task, data)


@runtime_checkable
class NamesFiles(Protocol):
    """A task whose rows name files (images, audio, captioned images)."""

    def file_column(self, data: DataSection) -> str | None:
        """The column holding a file path, resolved against the folder of the file that names
        it; a folder source then lists files, not .txt texts."""
        ...


def file_column(task: object, data: DataSection) -> str | None:
    """The column of file paths ``task``'s rows name (``NamesFiles``); None: rows hold text."""
    return task.file_column(data) if isinstance(task, NamesFiles) else None


@runtime_checkable
class GivesTexts(Protocol):
    """A task whose tokenizer is trained on other texts than data.text_column (for a
    from_config model without a tokenizer)."""

    def texts(self, rows: list[dict[str, Any]], data: DataSection) -> list[str]:
        """The texts a tokenizer is trained on."""
        ...


def texts(task: object, rows: Any, data: DataSection) -> list[str]:
    """The texts a tokenizer for ``task`` is trained on (``GivesTexts``); by default each
    row's data.text_column. ``rows``: the train rows (``Rows`` or a list); a task's error about
    one names data.train and the row's number there."""
    if isinstance(task, GivesTexts):
        try:
            return task.texts(rows, data)
        except InputError as err:
            origin = rows.origin() if hasattr(rows, "origin") else None
            raise at_source(err, data.train or "data.train", origin) from None
    return [str(row[data.text_column]) for row in rows]


ROW = re.compile(r"^row (\d+)")


def at_source(err: InputError, source: str, origin: Any = None, first: int = 0) -> InputError:
    """A task's error about its ``row N`` (the N-th of the rows it was given, which start at
    row ``first`` of a split) as ``{source}: row M: ...``, M the row's number in its source:
    ``origin[i]`` where a selection picked the split's rows (``Rows.origin``), else i + 1."""
    text = str(err)
    match = ROW.match(text)
    if match is None:
        return InputError(f"{source}: {text}")
    i = int(match[1]) - 1 + first
    n = int(origin[i]) + 1 if origin is not None else i + 1
    return InputError(f"{source}: row {n}{text[match.end() :]}")


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
    file_column: str | None = None  # a column of file paths (image tasks)

    @classmethod
    def of(cls, source: str, data: DataSection, task: RowColumns) -> RowCheck:
        own = own_columns(task)  # the task's task.*_column options, not data.*_column
        allowed = (
            tuple(data.label_names) if needs_labels(task) and data.label_names and not own else None
        )
        needed = tuple(columns(task, data))
        return cls(
            source=source,
            needed=needed,
            keep=tuple(dict.fromkeys([*needed, *read_columns(task, data)])),
            label_column=data.label_column if allowed else None,
            allowed=allowed,
            hint="set the task's column options (task.*_column)" if own else cls.hint,
            file_column=file_column(task, data),
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


def _check_columns(
    rows: list[dict[str, Any]], source: str, data: DataSection, task: RowColumns
) -> None:
    """Check rows already in memory (``ortft eval --data``)."""
    if not rows:
        raise InputError(f"{source}: no rows")
    check = RowCheck.of(source, data, task)
    for n, row in enumerate(rows, 1):
        check(n, row)


def check_table(ds: Any, check: RowCheck) -> None:
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
