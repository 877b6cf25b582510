"""The CI templates in examples/ci/ parse as YAML and call only commands that exist."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml
from typer.main import get_command

from ortft.cli.app import app

ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = sorted((ROOT / "examples" / "ci").glob("*.yml"))
MAKE_TARGETS = {
    line.split(":")[0]
    for line in (ROOT / "Makefile").read_text().splitlines()
    if line and not line[0].isspace() and ":" in line and not line.startswith((".", "#"))
}


def _commands(doc: dict) -> list[str]:
    """Every shell line of the workflow (GitHub `run:` steps, GitLab `script:` lists)."""
    out = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "run" and isinstance(value, str):
                    out.extend(line for line in value.splitlines() if line.strip())
                elif key == "script" and isinstance(value, list):
                    out.extend(value)
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(doc)
    return out


def test_there_are_templates() -> None:
    assert {p.name for p in TEMPLATES} == {"github-actions.yml", "gitlab-ci.yml"}


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.name)
def test_template_calls_only_existing_commands(path: Path) -> None:
    doc = yaml.safe_load(path.read_text())
    commands = _commands(doc)
    assert commands, "no commands found"
    ortft_commands = set(get_command(app).commands)  # type: ignore[attr-defined]
    seen_ortft = set()
    for line in commands:
        words = shlex.split(line.split("||")[0].split(">>")[0])
        if words[0] == "make":
            assert words[1] in MAKE_TARGETS, line
        elif words[0].endswith("ortft"):
            assert words[1] in ortft_commands, line
            seen_ortft.add(words[1])
            if words[1] == "train":
                gates = [words[i + 1] for i, w in enumerate(words) if w == "--gate"]
                assert gates and all(">=" in g for g in gates), "gates must be quoted for the shell"
    assert {"doctor", "validate", "train", "export"} <= seen_ortft
