"""The task registry: built-in tasks declare their own knowledge, a new task is one registration
(here a toy task from a test, no ortft file touched), and the recipe's `task:` follows it."""

from __future__ import annotations

import subprocess
import sys
from typing import Literal

import numpy as np
import pytest
from pydantic import Field

from ortft import tasks
from ortft.data import checks, rows
from ortft.recipe import io as recipe_io
from ortft.recipe.schema import Recipe
from ortft.tasks import protocols, traits

BASE = {
    "model": {
        "from_config": {"architecture": "bert", "hidden_size": 32, "num_layers": 2, "num_heads": 2},
        "tokenizer": {"train": {"kind": "wordpiece"}},
    },
    "data": {"train": "x.csv"},
}


class ToyOptions(tasks.TaskOptions):
    name: Literal["toy-echo"] = "toy-echo"
    echo_column: str = Field("text", description="toy-echo: the column to echo.")


class ToyEcho(tasks.Task):
    name = "toy-echo"
    auto_class = "AutoModelForMaskedLM"
    eval_metrics = ("eval_loss", "eval_accuracy")

    def __init__(self, options: ToyOptions):
        self.column = options.echo_column

    def encode(self, rows, tokenizer, data, label2id) -> tasks.Encoded:
        ids = np.ones((len(rows), data.max_length), dtype=np.int64)
        return tasks.Encoded({"input_ids": ids, "attention_mask": ids, "labels": ids})

    def metrics(self, loss, logits, labels):
        return {"loss": loss}


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tasks, "_tasks", dict(tasks._tasks))  # the registration ends with the test
    tasks.register("toy-echo", ToyOptions, ToyEcho)


def test_a_registered_toy_task_is_built_and_accepted_by_the_recipe(toy) -> None:
    assert "toy-echo" in tasks.names()
    task = tasks.get("toy-echo", tasks.options("toy-echo", echo_column="words"))
    assert isinstance(task, ToyEcho) and task.column == "words"
    # the documented defaults of a task that declares none of the traits
    assert (
        traits.decodes(task),
        traits.shifts_labels(task),
        traits.export_skip(task),
        task.options_key,
    ) == (
        False,
        False,
        None,
        "",
    )
    assert traits.export_kind(task) == "encoder" and not traits.ondevice(task)
    assert not checks.own_columns(task)
    batch = {"input_ids": np.zeros((2, 4))}
    assert task.collate(batch, 0, 1) is batch
    assert protocols.generated_metrics(task, None, None, None) == {}  # it generates nothing
    assert rows.labels_of(task, [{"text": "a"}], None) is None

    r = Recipe.model_validate({**BASE, "task": {"name": "toy-echo", "echo_column": "words"}})
    assert isinstance(r.task, ToyOptions) and r.task.echo_column == "words"
    assert r.model_dump(mode="json")["task"] == {"name": "toy-echo", "echo_column": "words"}
    assert Recipe.model_validate({**BASE, "task": "toy-echo"}).task.echo_column == "text"
    # its metrics are what early stopping may watch
    es = {"eval_every": 2, "early_stopping": {"metric": "eval_accuracy"}}
    Recipe.model_validate({**BASE, "task": "toy-echo", "training": es})
    with pytest.raises(ValueError, match="eval_perplexity is not a metric of toy-echo"):
        Recipe.model_validate(
            {
                **BASE,
                "task": "toy-echo",
                "training": {**es, "early_stopping": {"metric": "eval_perplexity"}},
            }
        )


def test_options_belong_to_their_task_also_for_a_registered_one(toy) -> None:
    with pytest.raises(
        ValueError, match="task.echo_column is an option of toy-echo, not of causal-lm"
    ):
        Recipe.model_validate({**BASE, "task": {"name": "causal-lm", "echo_column": "x"}})
    with pytest.raises(
        ValueError, match="task.mlm_probability is an option of masked-lm, not of toy"
    ):
        Recipe.model_validate({**BASE, "task": {"name": "toy-echo", "mlm_probability": 0.3}})
    # another task's option at its default is dropped (older ortft dumped every option)
    r = Recipe.model_validate({**BASE, "task": {"name": "toy-echo", "mlm_probability": 0.15}})
    assert r.task.model_dump() == {"name": "toy-echo", "echo_column": "text"}


def test_unknown_task_and_key_messages(toy, tmp_path) -> None:
    (tmp_path / "x.csv").write_text("text,label\na,b\n")
    path = tmp_path / "r.yaml"
    path.write_text(
        "model: {from_config: {architecture: bert}, tokenizer: {train: {kind: wordpiece}}}\n"
        "task:\n  name: toy-echo\n  echo_colum: words\ndata: {train: x.csv}\n"
    )
    with pytest.raises(Exception) as info:
        recipe_io.load(path)
    assert "task.echo_colum (line 4): unknown key; did you mean 'echo_column'?" in str(info.value)
    with pytest.raises(Exception) as info:
        recipe_io.load(path, ["task=translation"])
    message = str(info.value)
    assert "task.name" in message and "'causal-lm'" in message and "'toy-echo'" in message


def test_register_checks_the_name_literal() -> None:
    with pytest.raises(ValueError, match="must be Literal"):
        tasks.register("other-name", ToyOptions, ToyEcho)


def test_builtin_tasks_declare_export_kind_and_on_device_support() -> None:
    kinds = {name: traits.export_kind(tasks.get(name)) for name in tasks.names()}
    assert kinds == {
        "sequence-classification": "encoder",
        "causal-lm": "decoder",
        "token-classification": "per-token",
        "masked-lm": "per-token",
        "seq2seq": "seq2seq",
        "question-answering": "encoder",
        "instruction": "decoder",
        "image-classification": "image",
        "speech-recognition": "speech",
        "sentence-embedding": "embedding",
        "text-to-image": "text-to-image",
        "preference": "decoder",
        "reward-model": "encoder",  # the sequence classifiers' single graph of logits
        "image-text-to-text": "image-text-to-text",
    }
    assert [n for n in tasks.names() if traits.ondevice(tasks.get(n))] == [
        "sequence-classification",
        "causal-lm",
    ]
    # every built-in exports (image-text-to-text too, since issue 51 wired it)
    assert [n for n in tasks.names() if traits.export_skip(tasks.get(n))] == []


def test_architecture_guess_is_only_a_fallback() -> None:
    class Config:
        architectures = ["GPT2LMHeadModel"]

    assert tasks.from_architecture(Config()) == "causal-lm"
    Config.architectures = ["BertForTokenClassification"]
    assert tasks.from_architecture(Config()) == "token-classification"


def test_tasks_import_no_torch() -> None:
    code = (
        "import sys\nfrom ortft import tasks\n"
        "for n in tasks.names(): tasks.get(n)\n"
        "from ortft.recipe import schema\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "False", out.stderr
