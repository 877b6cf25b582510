"""ortft.backends.ondevice.schedules: the torch-free lr table matches transformers.get_scheduler step by step."""

from __future__ import annotations

import typing

import pytest

from ortft.backends.ondevice import schedules
from ortft.recipe.schema import Scheduler

STEPS = 37
LR = 3e-4


def _transformers_lrs(name: str, warmup: int, total: int) -> list[float]:
    """The lr each optimizer step uses, read as the PyTorch loop runs it: optimizer.step() at
    the scheduler's current lr, then scheduler.step()."""
    import torch
    from transformers import get_scheduler

    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=LR)
    scheduler = get_scheduler(name, optimizer, num_warmup_steps=warmup, num_training_steps=total)
    used = []
    for _ in range(total):
        used.append(optimizer.param_groups[0]["lr"])
        assert scheduler.get_last_lr()[0] == used[-1]
        optimizer.step()
        scheduler.step()
    return used


def test_every_recipe_schedule_is_in_the_table() -> None:
    assert set(typing.get_args(Scheduler)) == set(schedules.SCHEDULES)


@pytest.mark.parametrize("warmup", [5, 0])
@pytest.mark.parametrize("name", typing.get_args(Scheduler))
def test_matches_transformers(name: str, warmup: int) -> None:
    want = _transformers_lrs(name, warmup, STEPS)
    got = [
        schedules.lr_at(step, schedule=name, lr=LR, warmup_steps=warmup, total_steps=STEPS)
        for step in range(STEPS)
    ]
    assert got == pytest.approx(want, rel=1e-9, abs=0.0)


def test_warmup_starts_at_zero_and_reaches_lr() -> None:
    kw = {"schedule": "linear", "lr": LR, "warmup_steps": 5, "total_steps": STEPS}
    assert schedules.lr_at(0, **kw) == 0.0
    assert schedules.lr_at(5, **kw) == pytest.approx(LR)


def test_resolve_warmup_prefers_steps_over_ratio() -> None:
    assert schedules.resolve_warmup(3, 0.5, 100) == 3
    assert schedules.resolve_warmup(0, 0.1, 37) == 3  # int(3.7), as the PyTorch loop
    assert schedules.resolve_warmup(0, 0.0, 37) == 0


def test_unknown_schedule_and_polynomial_lr_are_errors() -> None:
    with pytest.raises(ValueError, match="unknown schedule"):
        schedules.lr_at(0, schedule="cosine_annealing", lr=LR, warmup_steps=0, total_steps=5)
    with pytest.raises(ValueError, match="lr_end"):
        schedules.lr_at(0, schedule="polynomial", lr=1e-8, warmup_steps=0, total_steps=5)


def test_the_module_imports_no_torch() -> None:
    import ast
    from pathlib import Path

    imported: set[str] = set()
    for node in ast.walk(ast.parse(Path(schedules.__file__).read_text())):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0])
    assert "torch" not in imported and "transformers" not in imported
