"""Recipes an editor checks: `ortft schema` prints the recipe's JSON Schema, committed as
docs/recipe.schema.json with the reference drawn from it (docs/recipe-reference.md); both
are current, every shipped recipe names the schema on its first line and validates against
it with check-jsonschema (offline: a local schema file)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from test_cli_recipes import runner

from ortft.cli.app import app as cli
from ortft.recipe import io as recipe_io
from ortft.tools import schema_doc, starter

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = ROOT / schema_doc.SCHEMA_FILE
REFERENCE = ROOT / schema_doc.REFERENCE_FILE
SHIPPED = [path for path, _ in starter.shipped_recipes()]
CHECK_JSONSCHEMA = (
    Path(sys.executable).parent / "check-jsonschema"
)  # pinned in requirements/dev.txt


def check_jsonschema(*files: Path) -> subprocess.CompletedProcess[str]:
    assert CHECK_JSONSCHEMA.exists(), "check-jsonschema: pip install -r requirements/dev.txt"
    args = [str(CHECK_JSONSCHEMA), "--no-cache", "--schemafile", str(SCHEMA), *map(str, files)]
    return subprocess.run(args, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    ("path", "text", "command"),
    [
        (SCHEMA, schema_doc.schema_text, "ortft schema -o docs/recipe.schema.json"),
        (REFERENCE, schema_doc.reference, "ortft schema --markdown -o docs/recipe-reference.md"),
    ],
    ids=["schema", "reference"],
)
def test_committed_file_is_current(path: Path, text, command: str) -> None:
    assert path.read_text(encoding="utf-8") == text(), f"{path.name} is stale: run `{command}`"


def test_schema_command_prints_both(tmp_path: Path) -> None:
    result = runner.invoke(cli, ["schema"])
    assert result.exit_code == 0, result.output
    assert result.stdout == schema_doc.schema_text()
    out = tmp_path / "ref.md"
    result = runner.invoke(cli, ["schema", "--markdown", "-o", str(out)])
    assert result.exit_code == 0 and result.stdout.strip() == str(out), result.output
    assert out.read_text(encoding="utf-8") == schema_doc.reference()


def test_schema_holds_every_task_and_its_options() -> None:
    schema = schema_doc.recipe_schema()
    task = schema["properties"]["task"]
    assert task["anyOf"][0]["enum"] == list(schema_doc.tasks.BUILTIN)
    picked = {b["if"]["properties"]["name"]["const"]: b["then"]["$ref"] for b in task["allOf"]}
    assert list(picked) == list(schema_doc.tasks.BUILTIN)
    seq2seq = schema["$defs"]["task.seq2seq"]["properties"]
    assert seq2seq["max_target_length"]["description"]
    assert "| `task.mlm_probability` |" in schema_doc.reference()


def test_every_shipped_recipe_names_the_schema_on_its_first_line() -> None:
    for path in SHIPPED:
        first = path.read_text(encoding="utf-8").splitlines()[0]
        head, _, target = first.partition("# yaml-language-server: $schema=")
        assert head == "" and target, f"{path}: first line {first!r}"
        assert (path.parent / target).resolve() == SCHEMA, f"{path}: {target} is not the schema"


def test_shipped_and_resolved_recipes_validate_against_the_schema(tmp_path: Path) -> None:
    """The recipes as shipped, and as a run folder stores them (every field spelled out)."""
    dumped = []
    for i, path in enumerate(SHIPPED):
        out = tmp_path / f"{i}-{path.name}"
        out.write_text(recipe_io.dump(recipe_io.load(path, check_files=False).recipe))
        dumped.append(out)
    result = check_jsonschema(*SHIPPED, *dumped)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ok -- validation done" in result.stdout


def test_the_schema_refuses_what_the_recipe_refuses(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "model: {name_or_path: m}\n"
        "task: {name: causal-lm, mlm_probability: 0.2}\n"  # a masked-lm option
        "data: {train: t.txt, max_lenght: 64}\n"
        "precision: fp17\n"
        "training: {max_time: soon}\n"
    )
    result = check_jsonschema(bad)
    assert result.returncode == 1, result.stdout + result.stderr
    for where in ["$.task", "'mlm_probability' was unexpected", "'max_lenght' was unexpected"]:
        assert where in result.stdout, result.stdout
    assert "$.precision" in result.stdout and "$.training.max_time" in result.stdout
