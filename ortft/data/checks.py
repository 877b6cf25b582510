"""Row checks: what every row of a source must hold (its columns; its label, when
``data.label_names`` is given), checked as the rows stream past or column-wise on an Arrow table.

Which columns those are comes from the task, through ``RowColumns``: the four members the checks
read (``ortft.tasks.Task`` has them; data never imports ``ortft.tasks``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from ortft.core.errors import InputError
from ortft.data.spec import DataSection


class RowColumns(Protocol):
    """Which columns a task reads of each row (``ortft.tasks.Task`` is one)."""

    @property
    def own_columns(self) -> bool:
        """Rows are read through the task's own column options (task.*_column), not data.*."""
        ...

    @property
    def needs_labels(self) -> bool:
        """The rows carry labels (data.label_column), checked against data.label_names."""
        ...

    def columns(self, data: DataSection) -> list[str]:
        """The columns every row must have."""
        ...

    def read_columns(self, data: DataSection) -> list[str]:
        """The columns encode() reads (what is kept of each row)."""
        ...

    def file_column(self, data: DataSection) -> str | None:
        """The column holding a file path (an image), resolved against the folder of the file
        that names it; None for text tasks. A folder source then lists files, not .txt texts."""
        ...


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
            file_column=task.file_column(data),
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
