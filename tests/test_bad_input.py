"""The bad-input table: every user mistake is one line on stderr, the right exit code, no traceback.

One row per case of the reliability issue that tests/test_recipe.py and tests/test_cli_recipes.py
do not already cover. Rows that fail while reading the recipe or the run directory run in-process
(CliRunner); rows that reach data or model loading run the real CLI in a subprocess, as a user
would (ORTModule needs real stdout/stderr file descriptors, and a subprocess keeps each row's
logging and signal handlers apart). Recipes use backend.name=torch where the backend is irrelevant.
"""

from __future__ import annotations

import gzip
import inspect
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import (
    save_pretrained_classifier,
    tiny_classifier,
    write_classification_csv,
    write_recipe,
)
from helpers import run_cli
from typer.testing import CliRunner

from ortft.cli.app import app

if "mix_stderr" in inspect.signature(CliRunner.__init__).parameters:
    runner = CliRunner(mix_stderr=False)
else:
    runner = CliRunner()


def base_recipe(tmp: Path, **changes: object) -> Path:
    """A tiny torch classifier on train.csv beside it; `changes` replace whole sections."""
    if not (tmp / "train.csv").exists():
        write_classification_csv(tmp / "train.csv", n=40)
    recipe = tiny_classifier("train.csv", backend="torch", max_steps=2)
    recipe["export"] = {"enabled": False}
    recipe.update(changes)
    return write_recipe(tmp / "r.yaml", recipe)


def in_process(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, ["train", *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stdout, result.stderr


def subprocess_cli(*args: str) -> tuple[int, str, str]:
    res = run_cli("train", *args, env={"NO_COLOR": "1"}, timeout=300)
    return res.returncode, res.stdout, res.stderr


def assert_one_line_error(code: int, out: str, err: str, expected_code: int) -> str:
    """The exit code, nothing on stdout, no traceback, and exactly one `error:` line, last."""
    assert code == expected_code, (code, err)
    assert "Traceback" not in out and "Traceback" not in err, err
    assert out == "", out
    lines = err.rstrip("\n").splitlines()
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0], err
    # everything before it is ortft's own progress, never a library's multi-line dump
    assert all(line.startswith("ortft ") for line in lines[:-1]), err
    return errors[0]


# --------------------------------------------------------------------------- setups
# Each returns the CLI arguments after `train`; files go in tmp.


def wrong_type_override(tmp: Path) -> list[str]:
    return [str(base_recipe(tmp)), "training.max_steps=abc"]


def wrong_type_in_yaml(tmp: Path) -> list[str]:
    recipe = tiny_classifier("train.csv", backend="torch")
    recipe["training"]["batch_size"] = [8, 16]
    write_classification_csv(tmp / "train.csv", n=40)
    return [str(write_recipe(tmp / "r.yaml", recipe))]


def wrong_type_bool(tmp: Path) -> list[str]:
    return [str(base_recipe(tmp)), "model.trust_remote_code=maybe"]


def out_of_range_length(tmp: Path) -> list[str]:
    return [str(base_recipe(tmp)), "data.max_length=4"]


def out_of_range_ratio(tmp: Path) -> list[str]:
    return [str(base_recipe(tmp)), "training.warmup_ratio=1.5"]


def out_of_range_dropout(tmp: Path) -> list[str]:
    return [str(base_recipe(tmp)), "model.dropout=1.0"]


def contradicting_model_sources(tmp: Path) -> list[str]:
    (tmp / "model").mkdir()
    return [str(base_recipe(tmp)), "model.name_or_path=./model"]


def contradicting_heads(tmp: Path) -> list[str]:
    return [str(base_recipe(tmp)), "model.from_config.num_heads=3"]


def contradicting_resume_never(tmp: Path) -> list[str]:
    (tmp / "run" / "step-000002").mkdir(parents=True)
    return [str(base_recipe(tmp)), "checkpoint.resume=never", "--output-dir", str(tmp / "run")]


def missing_eval_file(tmp: Path) -> list[str]:
    return [str(base_recipe(tmp)), "data.eval=held/out.csv"]


def missing_resume_checkpoint(tmp: Path) -> list[str]:
    return [str(base_recipe(tmp)), "checkpoint.resume=./gone/step-000004", "-o", str(tmp / "run")]


def resume_path_not_a_checkpoint(tmp: Path) -> list[str]:
    (tmp / "notckpt").mkdir()
    return [str(base_recipe(tmp)), "checkpoint.resume=notckpt", "-o", str(tmp / "run")]


def checkpoint_newer_format(tmp: Path) -> list[str]:
    ckpt = tmp / "step-000002"
    ckpt.mkdir()
    (ckpt / "manifest.json").write_text(json.dumps({"format_version": 99, "files": {}}))
    return [str(base_recipe(tmp)), f"checkpoint.resume={ckpt}", "-o", str(tmp / "run")]


def summary_newer_format(tmp: Path) -> list[str]:
    (tmp / "run").mkdir()
    (tmp / "run" / "summary.json").write_text(
        json.dumps({"format_version": 99, "status": "running"})
    )
    return [str(base_recipe(tmp)), "-o", str(tmp / "run")]


def output_dir_under_a_file(tmp: Path) -> list[str]:
    (tmp / "plain-file").write_text("not a folder")
    return [str(base_recipe(tmp)), "-o", str(tmp / "plain-file" / "run")]


def output_dir_is_a_file(tmp: Path) -> list[str]:
    (tmp / "plain-file").write_text("not a folder")
    return [str(base_recipe(tmp)), "checkpoint.output_dir=" + str(tmp / "plain-file")]


def override_without_equals(tmp: Path) -> list[str]:
    return [str(base_recipe(tmp)), "training.max_steps"]


def override_empty_key_part(tmp: Path) -> list[str]:
    return [str(base_recipe(tmp)), "training..lr=1e-3"]


def override_unknown_section(tmp: Path) -> list[str]:
    return [str(base_recipe(tmp)), "trainig.max_steps=3"]


# -- these reach data or model loading: subprocess


def empty_dataset(tmp: Path) -> list[str]:
    (tmp / "train.csv").write_text("text,label\n")
    return [str(base_recipe(tmp)), "-o", str(tmp / "run")]


def too_few_rows_for_a_batch(tmp: Path) -> list[str]:
    (tmp / "train.csv").write_text("text,label\na b,x\nc d,y\ne f,x\n")
    return [str(base_recipe(tmp)), "data.eval_fraction=0", "-o", str(tmp / "run")]


def missing_text_column(tmp: Path) -> list[str]:
    return [str(base_recipe(tmp)), "data.text_column=body", "-o", str(tmp / "run")]


def label_outside_label_names(tmp: Path) -> list[str]:
    return [str(base_recipe(tmp)), "data.label_names=[pos, neutral]", "-o", str(tmp / "run")]


def non_utf8_csv(tmp: Path) -> list[str]:
    (tmp / "train.csv").write_bytes(b"text,label\ngood film,pos\nna\xefve \xff plot,neg\n")
    return [str(base_recipe(tmp)), "-o", str(tmp / "run")]


def non_utf8_gzip_corpus(tmp: Path) -> list[str]:
    with gzip.open(tmp / "corpus.txt.gz", "wb") as fh:
        fh.write(b"first paragraph of text\n\nsecond \xe9t\xe9 paragraph\n")
    recipe = tiny_classifier("corpus.txt.gz", backend="torch")
    recipe["task"] = "causal-lm"
    recipe["model"]["from_config"]["architecture"] = "gpt2"
    recipe["model"]["tokenizer"]["train"]["kind"] = "byte-bpe"
    return [str(write_recipe(tmp / "r.yaml", recipe)), "-o", str(tmp / "run")]


def non_utf8_class_folder(tmp: Path) -> list[str]:
    for label, text in [("pos", b"fine film"), ("neg", b"dull \x80 film")]:
        (tmp / "docs" / label).mkdir(parents=True)
        (tmp / "docs" / label / "a.txt").write_bytes(text)
    return [str(base_recipe(tmp)), "data.train=./docs", "-o", str(tmp / "run")]


def model_dir_without_config(tmp: Path) -> list[str]:
    (tmp / "model").mkdir()
    (tmp / "model" / "README.md").write_text("weights coming soon\n")
    recipe = tiny_classifier("train.csv", backend="torch")
    recipe["model"] = {"name_or_path": "./model"}
    write_classification_csv(tmp / "train.csv", n=40)
    return [str(write_recipe(tmp / "r.yaml", recipe)), "-o", str(tmp / "run")]


def missing_model_dir(tmp: Path) -> list[str]:
    recipe = tiny_classifier("train.csv", backend="torch")
    recipe["model"] = {"name_or_path": "./models/bert-tiny"}
    write_classification_csv(tmp / "train.csv", n=40)
    return [str(write_recipe(tmp / "r.yaml", recipe)), "-o", str(tmp / "run")]


def checkpoint_of_another_model(tmp: Path) -> list[str]:
    """A real checkpoint of a hidden-32 model, resumed into a hidden-64 one."""
    from ortft.recipe import io as recipe_io
    from ortft.run import lifecycle as train_mod

    path = base_recipe(tmp, checkpoint={"save_every": 2})
    train_mod.run(
        recipe_io.load(path), output_dir=tmp / "small"
    )  # torch backend: in-process is fine
    return [
        str(path),
        "model.from_config.hidden_size=64",
        "checkpoint.resume=small/step-000002",
        "-o",
        str(tmp / "run"),
    ]


def pretrained_recipe(tmp: Path, model: str = "./model") -> Path:
    """A torch recipe fine-tuning the tiny pretrained folder tmp/model (2 labels, 64 positions)
    on train.csv."""
    write_classification_csv(tmp / "train.csv", n=40)
    texts = [line.split(",")[0] for line in (tmp / "train.csv").read_text().splitlines()[1:]]
    save_pretrained_classifier(tmp / "model", texts)
    recipe = tiny_classifier("train.csv", backend="torch", max_steps=2)
    recipe["model"] = {"name_or_path": model}
    recipe["export"] = {"enabled": False}
    return write_recipe(tmp / "r.yaml", recipe)


def truncated_safetensors(tmp: Path) -> list[str]:
    path = pretrained_recipe(tmp)
    weights = tmp / "model" / "model.safetensors"
    with open(weights, "r+b") as fh:  # a download cut halfway
        fh.truncate(weights.stat().st_size // 2)
    return [str(path), "-o", str(tmp / "run")]


def model_dir_without_tokenizer(tmp: Path) -> list[str]:
    """transformers 5 builds a 5-token tokenizer here; every word became [UNK] and ran."""
    path = pretrained_recipe(tmp)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp / "model" / name).unlink()
    return [str(path), "-o", str(tmp / "run")]


def tokenizer_of_another_model(tmp: Path) -> list[str]:
    """model.tokenizer.path names a folder with a bigger vocabulary than the model's rows."""
    from ortft.backends.torch.models import train_tokenizer
    from ortft.recipe.model import TrainTokenizer

    path = pretrained_recipe(tmp)
    words = [f"w{i}" for i in range(400)]
    texts = [" ".join(words[i : i + 20]) for i in range(0, 400, 5)]
    train_tokenizer(texts, TrainTokenizer(vocab_size=600, min_frequency=1)).save_pretrained(
        tmp / "other-tok"
    )
    return [str(path), "model.tokenizer.path=./other-tok", "-o", str(tmp / "run")]


def tokenizer_of_another_alphabet(tmp: Path) -> list[str]:
    """The model's own tokenizer, made for digits: every word of the data is [UNK]."""
    path = pretrained_recipe(tmp)
    digits = [" ".join(str(i * 7 % 97) for i in range(j, j + 20)) for j in range(50)]
    save_pretrained_classifier(tmp / "model", digits)  # its tokenizer and rows: digits only
    return [str(path), "-o", str(tmp / "run")]


def max_length_beyond_folder_positions(tmp: Path) -> list[str]:
    return [str(pretrained_recipe(tmp)), "data.max_length=128"]


def max_length_beyond_from_config_positions(tmp: Path) -> list[str]:
    return [str(base_recipe(tmp)), "data.max_length=600"]


IN_PROCESS, SUBPROCESS = "in-process", "subprocess"

# (setup, how to run it, exit code, what the one line must contain; {tmp} is the test folder)
ROWS: dict[str, tuple[Callable[[Path], list[str]], str, int, list[str]]] = {
    "wrong-type-override": (
        wrong_type_override,
        IN_PROCESS,
        2,
        ["training.max_steps (command-line override)", "valid integer"],
    ),
    "wrong-type-yaml": (
        wrong_type_in_yaml,
        IN_PROCESS,
        2,
        ["training.batch_size (line", "integer"],
    ),
    "wrong-type-bool": (wrong_type_bool, IN_PROCESS, 2, ["model.trust_remote_code", "boolean"]),
    "out-of-range-max-length": (
        out_of_range_length,
        IN_PROCESS,
        2,
        ["data.max_length", "greater than or equal to 8"],
    ),
    "out-of-range-warmup-ratio": (
        out_of_range_ratio,
        IN_PROCESS,
        2,
        ["training.warmup_ratio", "less than 1"],
    ),
    "out-of-range-dropout": (out_of_range_dropout, IN_PROCESS, 2, ["model.dropout", "less than 1"]),
    "contradicting-model-sources": (
        contradicting_model_sources,
        IN_PROCESS,
        2,
        ["exactly one of model.name_or_path or model.from_config"],
    ),
    "contradicting-heads": (
        contradicting_heads,
        IN_PROCESS,
        2,
        ["num_heads (3) must divide hidden_size (32)"],
    ),
    "contradicting-resume-never": (
        contradicting_resume_never,
        IN_PROCESS,
        2,
        ["{tmp}/run holds checkpoints", "checkpoint.resume=never"],
    ),
    "missing-eval-file": (
        missing_eval_file,
        IN_PROCESS,
        2,
        ["data.eval: {tmp}/held/out.csv does not exist"],
    ),
    "missing-resume-checkpoint": (
        missing_resume_checkpoint,
        IN_PROCESS,
        2,
        ["checkpoint.resume: {tmp}/gone/step-000004", "not a directory"],
    ),
    "resume-not-a-checkpoint": (
        resume_path_not_a_checkpoint,
        IN_PROCESS,
        2,
        ["checkpoint.resume: {tmp}/notckpt", "no manifest.json"],
    ),
    "checkpoint-newer-format": (
        checkpoint_newer_format,
        IN_PROCESS,
        2,
        ["checkpoint.resume: {tmp}/step-000002", "format_version 99"],
    ),
    "summary-newer-format": (
        summary_newer_format,
        IN_PROCESS,
        2,
        ["{tmp}/run/summary.json", "format_version 99"],
    ),
    "output-dir-under-a-file": (
        output_dir_under_a_file,
        IN_PROCESS,
        2,
        ["output dir {tmp}/plain-file/run is not writable"],
    ),
    "output-dir-is-a-file": (
        output_dir_is_a_file,
        IN_PROCESS,
        2,
        ["output dir {tmp}/plain-file is not writable"],
    ),
    "override-without-equals": (
        override_without_equals,
        IN_PROCESS,
        2,
        ["override 'training.max_steps' must look like section.key=value"],
    ),
    "override-empty-key-part": (
        override_empty_key_part,
        IN_PROCESS,
        2,
        ["override 'training..lr=1e-3' must look like section.key=value"],
    ),
    "override-unknown-section": (
        override_unknown_section,
        IN_PROCESS,
        2,
        ["trainig (command-line override): unknown key; did you mean 'training'?"],
    ),
    "missing-model-dir": (
        missing_model_dir,
        IN_PROCESS,
        2,
        ["model.name_or_path: {tmp}/models/bert-tiny does not exist"],
    ),
    "empty-dataset": (empty_dataset, SUBPROCESS, 2, ["train.csv: no rows"]),
    "too-few-rows": (
        too_few_rows_for_a_batch,
        SUBPROCESS,
        2,
        ["data.train: 3 examples make no batch of training.batch_size=8"],
    ),
    "missing-text-column": (
        missing_text_column,
        SUBPROCESS,
        2,
        ["train.csv: missing column body (has: label, text)"],
    ),
    "label-outside-label-names": (
        label_outside_label_names,
        SUBPROCESS,
        2,
        ["train.csv: row ", "is not one of data.label_names ['pos', 'neutral']"],
    ),
    "non-utf8-csv": (
        non_utf8_csv,
        SUBPROCESS,
        2,
        ["{tmp}/train.csv:3: not UTF-8 text (byte 0xef)"],
    ),
    "non-utf8-gzip": (
        non_utf8_gzip_corpus,
        SUBPROCESS,
        2,
        ["{tmp}/corpus.txt.gz:3: not UTF-8 text"],
    ),
    "non-utf8-folder-doc": (
        non_utf8_class_folder,
        SUBPROCESS,
        2,
        ["{tmp}/docs/neg/a.txt:1: not UTF-8 text"],
    ),
    "model-dir-without-config": (
        model_dir_without_config,
        SUBPROCESS,
        2,
        ["model.name_or_path: {tmp}/model is not a model directory (no config.json)"],
    ),
    "checkpoint-of-another-model": (
        checkpoint_of_another_model,
        SUBPROCESS,
        2,
        ["{tmp}/small/step-000002: checkpoint does not fit this recipe's model", "size mismatch"],
    ),
    "truncated-safetensors": (
        truncated_safetensors,
        SUBPROCESS,
        2,
        ["{tmp}/model/model.safetensors: truncated safetensors file"],
    ),
    "model-dir-without-tokenizer": (
        model_dir_without_tokenizer,
        SUBPROCESS,
        2,
        [
            "model.name_or_path: the tokenizer has 5 tokens for the model's",
            "{tmp}/model has none of tokenizer.json, tokenizer_config.json, vocab.txt",
        ],
    ),
    "tokenizer-of-another-model": (
        tokenizer_of_another_model,
        SUBPROCESS,
        2,
        ["model.tokenizer.path: the tokenizer has token ids up to", "embedding rows"],
    ),
    "tokenizer-of-another-alphabet": (
        tokenizer_of_another_alphabet,
        SUBPROCESS,
        2,
        ["model.name_or_path: 100% of the tokens of 36 training rows are [UNK]"],
    ),
    "max-length-beyond-model-positions": (
        max_length_beyond_folder_positions,
        IN_PROCESS,
        2,
        ["data.max_length: 128 is beyond the 64 positions of {tmp}/model/config.json"],
    ),
    "max-length-beyond-from-config-positions": (
        max_length_beyond_from_config_positions,
        IN_PROCESS,
        2,
        ["data.max_length=600 is beyond the 512 positions of model.from_config"],
    ),
}


@pytest.mark.parametrize("name", list(ROWS))
def test_bad_input_is_one_line_and_the_right_exit_code(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    setup, how, expected_code, needles = ROWS[name]
    tmp = tmp_path.resolve()
    monkeypatch.chdir(tmp)  # relative --output-dir / resume paths, as a user in that folder
    args = setup(tmp)
    code, out, err = (in_process if how == IN_PROCESS else subprocess_cli)(*args)
    line = assert_one_line_error(code, out, err, expected_code)
    for needle in needles:
        assert needle.format(tmp=tmp) in line, line


def test_debug_shows_the_traceback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--debug is the one way to see where a bad input was caught."""
    monkeypatch.chdir(tmp_path)
    args = output_dir_under_a_file(tmp_path.resolve())
    res = run_cli("--debug", "train", *args, env={"NO_COLOR": "1"}, timeout=300)
    assert res.returncode != 0
    assert "Traceback" in res.stderr and "InputError" in res.stderr


def test_csv_with_byte_order_mark_reads_its_first_column(tmp_path):
    from ortft.data.rows import _read_file
    from ortft.recipe.schema import DataSection

    path = tmp_path / "bom.csv"
    path.write_bytes("\ufefftext,label\nhello,pos\n".encode())
    rows = _read_file(path, "csv", DataSection(train=str(path)))
    assert rows == [{"text": "hello", "label": "pos"}]
