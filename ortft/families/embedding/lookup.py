"""Every text kind's word embeddings in one lookup of the model's table.

The task calls the encoder once per text kind (anchors, positives, negatives), each at its own
length. Each call looks its tokens up in the input-embedding table, and each lookup's backward
makes a dense gradient of the whole table ([30522, 384] fp32 for MiniLM: 47 MB written as zeros,
then scattered into) that autograd then adds into the others. Here the tokens of all kinds go
through the table in one call before the encoder calls, and each call's lookup of its own ids is
served the rows already looked up (``served``): one dense gradient a step, whatever the number
of kinds. The model is still called with its ``input_ids``, so whatever else it derives from
them (RoBERTa's position ids count the non-padding tokens) is unchanged.

Eager PyTorch only: under ORTModule's export and inside a compiled graph the table is looked up
per call as before (``applies``). A model without a ``get_input_embeddings`` table, or one that
passes the table something other than the ids it was called with, is looked up per call too.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import torch
from torch import nn

from ortft.tasks import tracing


def table_of(model: Any) -> nn.Module | None:
    """The model's input-embedding module (transformers' ``get_input_embeddings``), or None."""
    get = getattr(model, "get_input_embeddings", None)
    if get is None:
        return None
    try:
        table = get()
    except NotImplementedError:  # transformers' answer where a model names no table
        return None
    return table if isinstance(table, nn.Module) else None


def applies() -> bool:
    """Not while ORTModule exports the forward or dynamo traces it: those graphs keep a lookup
    per call (the override below is Python the graph would not see again)."""
    return not tracing.traced()


def one_lookup(model: Any, ids: list[torch.Tensor]) -> list[AbstractContextManager[None]]:
    """For each of ``ids``, a context in which the model's table serves those ids from one
    lookup of them all; contexts that do nothing where that does not apply."""
    table = table_of(model) if applies() else None
    if table is None:
        return [nullcontext() for _ in ids]
    rows = look_up(table, ids)
    return [served(table, i, r) for i, r in zip(ids, rows, strict=True)]


def look_up(table: nn.Module, ids: list[torch.Tensor]) -> list[torch.Tensor]:
    """``table`` applied once to the tokens of all ``ids``, split back: [rows, length, width]
    for each."""
    rows = table(torch.cat([i.reshape(-1) for i in ids]))
    parts = rows.split([i.numel() for i in ids])
    return [p.view(*i.shape, -1) for p, i in zip(parts, ids, strict=True)]


@contextmanager
def served(table: nn.Module, ids: torch.Tensor, rows: torch.Tensor) -> Iterator[None]:
    """Inside, ``table`` called with ``ids`` (the very tensor) returns ``rows``; called with
    anything else, it looks up as it always does."""
    own = table.forward
    had = "forward" in vars(table)  # an instance-level forward of its own, put back after

    def forward(*args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and not kwargs and args[0] is ids:
            return rows
        return own(*args, **kwargs)

    table.forward = forward  # type: ignore[method-assign]
    try:
        yield
    finally:
        if had:
            table.forward = own  # type: ignore[method-assign]
        else:
            del table.forward
