"""No hidden switches: every ORTFT_* variable the package reads is a listed developer override
(named on stderr, recorded in summary.json) or a listed location (ortft.core.devenv)."""

from __future__ import annotations

import ast
import copy
import json
import os
import re
from pathlib import Path

import pytest
from conftest import tiny_classifier, write_classification_csv, write_recipe
from typer.testing import CliRunner

from ortft.cli.app import app
from ortft.core import devenv

PACKAGE = Path(__file__).resolve().parent.parent / "ortft"
VARIABLE = re.compile(r"ORTFT_[A-Z0-9_]*[A-Z0-9]")


def variables_named(root: Path = PACKAGE) -> dict[str, list[str]]:
    """Every string in the package that is a whole ORTFT_* variable name, and where it is."""
    found: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            text = node.value if isinstance(node, ast.Constant) else None
            if isinstance(text, str) and VARIABLE.fullmatch(text):
                found.setdefault(text, []).append(f"{path.name}:{node.lineno}")
    return found


def test_every_variable_the_package_names_is_listed() -> None:
    found = variables_named()
    listed = {*devenv.OVERRIDES, *devenv.LOCATIONS}
    assert {k: v for k, v in found.items() if k not in listed} == {}
    # and the tables name no variable the package has stopped reading
    assert listed <= set(found)


def test_the_scan_sees_a_new_variable(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text('import os\nx = os.environ.get("ORTFT_NEW_KNOB", "1")\n')
    assert variables_named(tmp_path) == {"ORTFT_NEW_KNOB": ["m.py:2"]}


def test_only_set_overrides_count() -> None:
    env = {"ORTFT_ORT_SPINNING": "1", "ORTFT_TORCH_ATTN": "", "ORTFT_CACHE": "/tmp/c"}
    assert devenv.set_overrides(env) == {"ORTFT_ORT_SPINNING": "1"}


@pytest.mark.parametrize("rebound", [False, True], ids=["environ", "rebound-environ"])
def test_a_run_names_and_records_its_overrides(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rebound: bool
) -> None:
    write_classification_csv(tmp_path / "train.csv")
    recipe = tiny_classifier("train.csv", backend="torch", max_steps=1)
    recipe["data"]["eval_fraction"] = 0.0
    recipe["export"] = {"enabled": False}
    path = write_recipe(tmp_path / "r.yaml", recipe)
    if rebound:  # what datasets' map(num_proc=...) leaves behind in a test worker
        monkeypatch.setattr(os, "environ", copy.deepcopy(os.environ))
    monkeypatch.setenv("ORTFT_ORT_SPINNING", "1")
    monkeypatch.setenv("ORTFT_TORCH_ATTN", "")  # set but empty: unset
    run = tmp_path / "run"
    res = CliRunner().invoke(app, ["train", str(path), "--output-dir", str(run)])
    assert res.exit_code == 0, res.output
    summary = json.loads((run / "summary.json").read_text())
    assert summary["provenance"]["developer_overrides"] == {"ORTFT_ORT_SPINNING": "1"}
    assert "developer override ORTFT_ORT_SPINNING=1" in res.stderr
    assert "ORTFT_TORCH_ATTN" not in res.stderr
