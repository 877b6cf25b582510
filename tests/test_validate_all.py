"""A recipe that breaks several cross-field rules lists every one of them in one run, as it
does for field errors: `ortft validate` and `ortft train` (which validates first), exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_cli_recipes import TINY, invoke

from ortft.core.errors import EXIT_USAGE

# Three rules from three places in rules.py: a precision/device combination, a streaming rule
# (the default data.eval_fraction is 0.1) and an eval user (Recipe's second validator before).
BROKEN = TINY.replace(
    "  max_length: 16\n", "  max_length: 16\n  streaming: true\n  label_names: [a, b]\n"
) + ("hardware: {device: cpu}\nprecision: {dtype: fp16}\ncheckpoint: {final: best}\n")

EXPECTED = [
    "precision.dtype=fp16 needs CUDA: PyTorch has no fp16 training on cpu; "
    "use bf16 (backend.name=torch) or fp32",
    "data.streaming cannot hold out data.eval_fraction of a stream; "
    "give data.eval (read in full) or set data.eval_fraction: 0",
    "checkpoint.final=best needs training.eval_every (evaluations during training)",
]


@pytest.fixture
def broken(tmp_path: Path) -> Path:
    (tmp_path / "train.csv").write_text("text,label\na b,a\nc d,b\n")
    path = tmp_path / "broken.yaml"
    path.write_text(BROKEN % "train.csv")
    return path


@pytest.mark.parametrize("command", ["validate", "train"])
def test_every_broken_rule_is_listed_in_one_run(broken: Path, command: str) -> None:
    result = invoke(command, str(broken))
    assert result.exit_code == EXIT_USAGE, result.output
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert f"error: {broken}: 3 problems" in lines, result.stderr
    assert [line.removeprefix("  - ") for line in lines if line.startswith("  - ")] == EXPECTED


def test_fixing_one_rule_leaves_the_other_two(broken: Path) -> None:
    result = invoke("validate", str(broken), "--set", "precision.dtype=fp32")
    assert result.exit_code == EXIT_USAGE, result.output
    assert f"error: {broken}: 2 problems" in result.stderr.splitlines(), result.stderr
    assert EXPECTED[0] not in result.stderr
    assert all(line in result.stderr for line in EXPECTED[1:])
