"""The CLI on recipes and inputs: shipped recipes validate; every mistake is exit 2 and one readable
message on stderr, never a traceback, and found before any training."""

from __future__ import annotations

import inspect
import re
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ortft.cli.app import app
from ortft.core.errors import EXIT_USAGE
from ortft.tools import starter

# click >= 8.2 keeps stdout and stderr apart by default and dropped mix_stderr
if "mix_stderr" in inspect.signature(CliRunner.__init__).parameters:
    runner = CliRunner(mix_stderr=False)
else:
    runner = CliRunner()

SHIPPED = starter.shipped_recipes()
REPO_ROOT = starter.recipes_dir().parent

# A tiny model from config and a tokenizer trained locally: nothing is downloaded.
TINY = """\
model:
  from_config: {architecture: bert, hidden_size: 32, num_layers: 2, num_heads: 2}
  tokenizer:
    train: {kind: wordpiece, vocab_size: 100, min_frequency: 1}
task: sequence-classification
data:
  train: %s
  max_length: 16
training:
  max_steps: 2
  batch_size: 2
backend:
  name: torch
export:
  enabled: false
"""


def invoke(*args: str):
    return runner.invoke(app, [str(a) for a in args])


def assert_clean_usage_error(result) -> str:
    """Exit 2, an `error:` message on stderr, nothing on stdout, no traceback anywhere."""
    assert result.exit_code == EXIT_USAGE, (result.exit_code, result.output)
    assert "Traceback" not in result.output and "Traceback" not in result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert result.stdout == ""
    # train logs its progress (`ortft ...` lines) on stderr before it reaches the mistake
    head, sep, message = result.stderr.partition("error: ")
    assert sep, result.stderr
    assert all(line.startswith("ortft ") for line in head.splitlines()), result.stderr
    return sep + message


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return path


# --------------------------------------------------------------------------- shipped recipes


def test_there_are_shipped_recipes():
    names = {path.name for path, _ in SHIPPED}
    assert {"quickstart.yaml", "causal-lm.yaml"} <= names


@pytest.mark.parametrize("path", [p for p, _ in SHIPPED], ids=[p.name for p, _ in SHIPPED])
def test_every_shipped_recipe_validates(path):
    result = invoke("validate", path)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == f"ok  {path}"
    assert result.stderr == ""


@pytest.mark.parametrize("path", [p for p, _ in SHIPPED], ids=[p.name for p, _ in SHIPPED])
def test_every_shipped_recipe_documents_its_run_command(path):
    header = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        header.append(line)
    assert header, f"{path.name} must start with a comment"
    rel = path.relative_to(REPO_ROOT).as_posix()
    commands = [
        line.lstrip("# ").strip()
        for line in header
        if "ortft train" in line or "ortft bench" in line
    ]
    # the exact command, on its own line (bench recipes are run by `ortft bench`)
    assert f"ortft train {rel}" in commands or any(
        c.startswith(f"ortft bench {rel}") for c in commands
    ), header
    # and one override example
    example = re.compile(rf"ortft train {re.escape(rel)}( \S+=\S+)+")
    assert any(example.fullmatch(c) for c in commands), header


def test_shipped_recipes_validate_together_with_an_override():
    paths = [p for p, _ in SHIPPED]
    result = invoke("validate", *paths, "--set", "training.max_steps=3")
    assert result.exit_code == 0, result.stderr
    assert len(result.stdout.splitlines()) == len(paths)


def test_recipes_lists_the_shipped_recipes():
    result = invoke("recipes")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert any(line.split("\t")[0].endswith("quickstart.yaml") for line in lines), result.stdout
    assert any(line.split("\t")[0].endswith("causal-lm.yaml") for line in lines), result.stdout
    for line in lines:  # path<TAB>one-line description
        path, summary = line.split("\t")
        assert Path(path).is_file() and summary


# --------------------------------------------------------------------------- validate: bad recipes


def test_validate_bad_recipe_lists_one_line_per_problem(tmp_path):
    path = write(
        tmp_path,
        "bad.yaml",
        """\
        model:
          from_config: {architecture: bert}
          tokenizer: {train: {}}
        task: sequence-classification
        data:
          train: missing.csv
        training:
          max_step: 20
          lr: 3
        backend:
          name: onnx
        """,
    )
    result = invoke("validate", path)
    stderr = assert_clean_usage_error(result)
    lines = stderr.splitlines()
    assert lines[0] == f"error: {path}: 3 problems"
    problems = sorted(lines[1:])
    assert problems[0].startswith("  - backend.name (line 11): Input should be 'ort', 'torch'")
    assert problems[1:] == [
        "  - training.lr (line 9): Input should be less than 1",
        "  - training.max_step (line 8): unknown key; did you mean 'max_steps'?",
    ]


def test_validate_reports_missing_files_after_the_schema_passes(tmp_path):
    path = write(tmp_path, "r.yaml", TINY % "data/train.csv")
    stderr = assert_clean_usage_error(invoke("validate", path))
    assert f"data.train: {tmp_path.resolve() / 'data' / 'train.csv'} does not exist" in stderr


def test_validate_checks_every_file_and_fails_if_any_fails(tmp_path):
    good = starter.recipes_dir() / "causal-lm.yaml"
    bad = write(tmp_path, "bad.yaml", "model: [\n")
    result = invoke("validate", good, bad)
    assert result.exit_code == EXIT_USAGE
    assert result.stdout.strip() == f"ok  {good}"  # the good one is still reported
    assert "malformed YAML" in result.stderr and "line 2, column 1" in result.stderr
    assert "Traceback" not in result.stderr


def test_validate_missing_recipe_file(tmp_path):
    stderr = assert_clean_usage_error(invoke("validate", tmp_path / "nope.yaml"))
    assert "recipe file not found" in stderr


def test_validate_malformed_override():
    path = starter.recipes_dir() / "causal-lm.yaml"
    stderr = assert_clean_usage_error(invoke("validate", path, "--set", "foo"))
    assert "override 'foo' must look like section.key=value" in stderr


# --------------------------------------------------------------------------- train: input errors


@pytest.fixture
def no_training(monkeypatch):
    """Make reaching the tokenizer training, model build or the loop a test failure."""
    from ortft.backends.torch import models

    def reached(*_a, **_k):
        pytest.fail("training went past input checking")

    monkeypatch.setattr(models, "train_tokenizer", reached)
    monkeypatch.setattr(models, "build_model", reached)


def test_train_bad_recipe_exits_2_before_training(tmp_path, no_training):
    (tmp_path / "train.csv").write_text("text,label\na,b\n")
    path = write(tmp_path, "r.yaml", (TINY % "train.csv").replace("max_steps", "max_step"))
    run_dir = tmp_path / "run"
    stderr = assert_clean_usage_error(invoke("train", path, "--output-dir", run_dir))
    assert "did you mean 'max_steps'" in stderr
    assert not run_dir.exists()


def test_train_bad_override_exits_2(tmp_path, no_training):
    (tmp_path / "train.csv").write_text("text,label\na,b\n")
    path = write(tmp_path, "r.yaml", TINY % "train.csv")
    run_dir = tmp_path / "run"
    stderr = assert_clean_usage_error(
        invoke("train", path, "backend.name=onnx", "--output-dir", run_dir)
    )
    assert "backend.name (command-line override): Input should be 'ort', 'torch'" in stderr
    assert not run_dir.exists()


def test_train_missing_label_column_exits_2_naming_it(tmp_path, no_training):
    (tmp_path / "train.csv").write_text(
        "text,category\n" + "".join(f"example {i},c{i % 2}\n" for i in range(20))
    )
    path = write(tmp_path, "r.yaml", TINY % "train.csv")
    run_dir = tmp_path / "run"
    stderr = assert_clean_usage_error(invoke("train", path, "--output-dir", run_dir))
    assert "missing column label" in stderr
    assert "has: category, text" in stderr
    assert len(stderr.splitlines()) == 1
    assert not (run_dir / "metrics.jsonl").exists() and not (run_dir / "summary.json").exists()


def test_train_invalid_jsonl_exits_2_with_file_and_line(tmp_path, no_training):
    data = tmp_path / "train.jsonl"
    data.write_text('{"text": "good", "label": "a"}\n\n{"text": "bad", "label": \n')
    path = write(tmp_path, "r.yaml", TINY % "train.jsonl")
    stderr = assert_clean_usage_error(invoke("train", path, "--output-dir", tmp_path / "run"))
    assert f"{data.resolve()}:3: not valid JSON" in stderr
    assert len(stderr.splitlines()) == 1


@pytest.mark.parametrize(
    "content, needle",
    [
        ("1\n2\n", "row 1 is a int, not an object of columns"),
        ('{"text": "a", "label": "x"}\n{"text": "b"}\n', "row 2: missing column label (has: text)"),
        ('{"text": "a", "label": "x"}\n{"label": 1}\n', "row 2: missing column text (has: label)"),
    ],
)
def test_train_rows_that_are_not_complete_objects_exit_2(tmp_path, no_training, content, needle):
    (tmp_path / "train.jsonl").write_text(content)
    path = write(tmp_path, "r.yaml", TINY % "train.jsonl")
    stderr = assert_clean_usage_error(invoke("train", path, "--output-dir", tmp_path / "run"))
    assert needle in stderr
    assert len(stderr.splitlines()) == 1


# --------------------------------------------------------------------------- init


@pytest.mark.parametrize(
    "task, placeholders",
    [
        ("sequence-classification", {"path/to/model": None, "data/train.csv": "text,label\nx,a\n"}),
        ("causal-lm", {"data/corpus.txt": "Some text.\n\nMore text.\n"}),
        ("image-classification", {"path/to/model": None, "data/images": None}),
    ],
)
def test_init_writes_a_recipe_that_validates_once_its_paths_exist(tmp_path, task, placeholders):
    printed = invoke("init", "--task", task)
    assert printed.exit_code == 0, printed.stderr
    assert printed.stdout.startswith("#")

    out = tmp_path / "mine.yaml"
    result = invoke("init", "--task", task, "-o", out)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == str(out)
    text = out.read_text()
    assert text.replace("recipe.yaml", "") == printed.stdout.replace("recipe.yaml", "")

    # as written, only the placeholder paths are wrong
    stderr = assert_clean_usage_error(invoke("validate", out))
    for placeholder in placeholders:
        assert str(tmp_path.resolve() / placeholder) in stderr
    for placeholder, content in placeholders.items():
        target = tmp_path / placeholder
        if content is None:
            target.mkdir(parents=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content)
    result = invoke("validate", out)
    assert result.exit_code == 0, result.stderr


def test_init_starters_come_from_their_families_and_name_a_route_this_install_has(monkeypatch):
    assert list(starter.starters()) == [
        "sequence-classification",
        "causal-lm",
        "image-classification",
        "speech-recognition",
    ]
    for task in starter.starters():
        monkeypatch.setattr(starter.ort_training, "installed", lambda: None)
        assert "\n  name: auto " in starter.recipe_text(task)
        monkeypatch.setattr(
            starter.ort_training, "installed", lambda: ("onnxruntime-training", "1")
        )
        assert "\n  name: ort " in starter.recipe_text(task)


def test_init_refuses_to_overwrite_without_force(tmp_path):
    out = tmp_path / "r.yaml"
    out.write_text("keep me\n")
    stderr = assert_clean_usage_error(invoke("init", "-o", out))
    assert "--force" in stderr
    assert out.read_text() == "keep me\n"
    result = invoke("init", "-o", out, "--force")
    assert result.exit_code == 0, result.stderr
    assert out.read_text().startswith("# A text classifier")


def test_init_unknown_task(tmp_path):
    stderr = assert_clean_usage_error(invoke("init", "--task", "bogus"))
    assert "--task must be one of: sequence-classification, causal-lm" in stderr


# --------------------------------------------------------------------------- usage


@pytest.mark.parametrize(
    "args",
    [
        ["train", "r.yaml", "--bogus"],
        ["validate", "--nope", "r.yaml"],
        ["init", "--frobnicate"],
        ["train"],
    ],
)
def test_bad_command_line_is_a_usage_error(args):
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
