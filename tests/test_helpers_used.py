"""Tests run the CLI through tests/helpers.py only: no test module builds its own
`python -m ortft` command line (a copied runner, with its own timeout and environment).

Parsing with ``ast`` runs nothing: this costs milliseconds. Docstrings and comments may say
`python -m ortft`; what counts is code: a list or tuple whose items hold ``"-m"`` then
``"ortft"`` (``subprocess.run([sys.executable, "-m", "ortft", ...])``, a ``Popen`` of it, a
torchrun command ending in it), or one string that is such a command line.
"""

from __future__ import annotations

import ast
from itertools import pairwise
from pathlib import Path

TESTS = Path(__file__).resolve().parent
HELPERS = TESTS / "helpers.py"
FLAG = "-m"
MODULE = "ortft"


def _is(node: ast.AST, value: str) -> bool:
    return isinstance(node, ast.Constant) and node.value == value


def copied_runners(source: str) -> list[int]:
    """The lines of ``source`` where code spells out a `python -m ortft` command."""
    tree = ast.parse(source)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.List | ast.Tuple):
            if any(_is(a, FLAG) and _is(b, MODULE) for a, b in pairwise(node.elts)):
                lines.append(node.lineno)
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
            and f"{FLAG} {MODULE}" in " ".join(node.value.split())
        ):
            lines.append(node.lineno)
    return sorted(set(lines))


def test_no_test_module_runs_the_cli_but_through_helpers() -> None:
    found = {
        path.name: lines
        for path in sorted(TESTS.rglob("*.py"))
        if path != HELPERS and (lines := copied_runners(path.read_text()))
    }
    assert not found, (
        f"a `python {FLAG} {MODULE}` command outside tests/helpers.py (use helpers.run_cli or "
        f"helpers.start_cli): {found}"
    )


def test_the_scan_sees_a_copied_runner() -> None:
    """The scan itself: each form a copy took is found, a docstring or comment is not."""
    # spelt with FLAG and MODULE, so that this file holds no such command itself
    copies = [
        f'subprocess.run([sys.executable, "{FLAG}", "{MODULE}", "train", *args], timeout=600)',
        f'subprocess.Popen([*launcher, "{FLAG}", "{MODULE}", "train"], stdout=subprocess.PIPE)',
        f'head = ["{FLAG}", "{MODULE}"] if torch else ["-c", NO_TORCH]',
        f'cmd = (sys.executable, "{FLAG}", "{MODULE}")',
        f'subprocess.run(f"{{sys.executable}} {FLAG} {MODULE} train r.yaml", shell=True)',
    ]
    for line in copies:
        assert copied_runners(line) == [1], line
    fine = (
        f'"""Runs `python {FLAG} {MODULE} train`."""\n# python {FLAG} {MODULE}\nrun_cli("train")\n'
    )
    assert copied_runners(fine) == []
    assert copied_runners(HELPERS.read_text())  # the one place that builds the command
