"""Extending ortft without touching the loop: a toy engine registered from a test drives the one
lifecycle (run dir, loop, checkpoints, stop rules, final/, gates, summary) end to end; and the
lifecycle itself stays torch-free."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import tiny_classifier, write_classification_csv, write_recipe

from ortft import backends
from ortft.backends import Started, StepResult
from ortft.backends.torch import models
from ortft.checkpoint import store as checkpoint
from ortft.core.errors import GateError
from ortft.recipe import backends as recipe_backends
from ortft.recipe import io as recipe_io
from ortft.run import lifecycle
from ortft.run.summary import BackendReport


class ToyEngine:
    """A model with one number: the loss halves every step. Enough to exercise the lifecycle."""

    name = "toy"

    def __init__(self, loaded: Any) -> None:
        self.recipe, self.value, self.steps_run, self.closed = loaded.recipe, 1.0, 0, None

    def start(self, recipe: Any) -> Started:
        return Started("cpu", 1, "toy")

    def is_main(self) -> bool:
        return True

    def any_rank(self, *flags: bool) -> tuple[bool, ...]:
        return flags

    def tokenizer(self, loaded, run_dir, task, train_rows, labels) -> Any:
        texts = [str(r["text"]) for r in train_rows]
        return models.train_tokenizer(texts, loaded.recipe.model.tokenizer.train)

    def prepare(self, loaded, task, tokenizer, labels, train, run_dir, resume_from, total_steps):
        self.task = task
        state = checkpoint.TrainState()
        if resume_from is not None:
            state = checkpoint.TrainState(**json.loads((resume_from / "state.json").read_text()))
            self.value = json.loads((resume_from / "toy.json").read_text())["value"]
        return state

    def train_step(self, micro_batches: list[dict[str, np.ndarray]]) -> StepResult:
        assert micro_batches[0]["input_ids"].shape[0] == self.recipe.training.batch_size
        self.value /= 2
        self.steps_run += 1
        return StepResult(loss=self.value, lr=self.recipe.training.lr)

    def eval_mode(self, on: bool) -> None:
        pass

    def eval_batch(self, batch: dict[str, np.ndarray]) -> tuple[float, np.ndarray]:
        valid = int(batch["_valid"])
        logits = np.zeros((valid, 2), dtype=np.float32)
        logits[:, 1] = 1.0  # always the second label
        return self.value, logits

    def extra_metrics(self, task: Any, tokenizer: Any, encoded: Any) -> dict[str, float]:
        return {}

    def save(self, run_dir: Path, state, recipe_yaml: str, keep_last: int) -> Path:
        from ortft.core import fsutil

        final = run_dir / checkpoint.checkpoint_name(state.step)
        with fsutil.atomic_dir(final) as tmp:
            (tmp / "toy.json").write_text(json.dumps({"value": self.value}))
            (tmp / "state.json").write_text(json.dumps(asdict(state)))
            checkpoint.write_manifest(tmp, state.step, "toy-checkpoint")
        return final

    def checkpoint_problem(self, path: Path) -> str | None:
        return checkpoint.kind_problem(path, "toy-checkpoint")

    def save_best(self, run_dir: Path, state) -> None:
        pass

    def select_final(self, selector: Any, run_dir: Path, state) -> None:
        selector.load_final(run_dir, None, state)

    def write_final(self, folder: Path) -> None:
        (folder / "toy.json").write_text(json.dumps({"value": self.value}))

    def export(self, run_dir: Path, final_dir: Path, samples: Any) -> None:
        return None

    def parameter_counts(self) -> tuple[int, int]:
        return 1, 1

    def precision(self) -> None:
        return None

    def report(self) -> BackendReport:
        return BackendReport(requested="toy", used="toy", notes=["a test's engine"])

    def close(self, ok: bool) -> None:
        self.closed = ok


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> list[ToyEngine]:
    made: list[ToyEngine] = []

    def factory(loaded: Any) -> ToyEngine:
        made.append(ToyEngine(loaded))
        return made[-1]

    # through the public call, undone after the test: the engine's factory and its recipe name
    monkeypatch.setattr(backends, "_FACTORIES", dict(backends._FACTORIES))
    monkeypatch.setattr(recipe_backends, "_REGISTERED", list(recipe_backends._REGISTERED))
    backends.register("toy", factory)
    return made


def _recipe(tmp_path: Path) -> Path:
    write_classification_csv(tmp_path / "train.csv")
    r = tiny_classifier("train.csv", backend="torch", max_steps=6, batch_size=8)
    r["checkpoint"] = {"save_every": 2}
    r["export"] = {"enabled": False}
    return write_recipe(tmp_path / "r.yaml", r)


def test_a_registered_engine_runs_the_whole_lifecycle(tmp_path: Path, toy: list) -> None:
    loaded = recipe_io.load(_recipe(tmp_path), ["backend.name=toy"])
    summary = lifecycle.run(loaded, output_dir=tmp_path / "run")
    engine = toy[0]
    assert engine.steps_run == 6 and engine.closed is True
    assert summary.status == "completed" and summary.steps == 6
    assert summary.backend.used == "toy" and summary.metrics["train_loss"] == 1 / 64
    assert "eval_accuracy" in summary.metrics  # the task's metrics, from the toy's logits
    run = tmp_path / "run"
    assert json.loads((run / "final/toy.json").read_text()) == {"value": 1 / 64}
    assert (run / "final/recipe.yaml").exists() and (run / "final/README.md").exists()
    assert [p.name for p in checkpoint.list_checkpoints(run)][-1] == "step-000006"
    on_disk = json.loads((run / "summary.json").read_text())
    assert on_disk["backend"]["notes"] == ["a test's engine"] and on_disk["steps"] == 6


def test_the_toy_engine_resumes_and_gets_gate_verdicts(tmp_path: Path, toy: list) -> None:
    path, run = _recipe(tmp_path), tmp_path / "run"
    lifecycle.run(recipe_io.load(path, ["backend.name=toy", "training.max_steps=4"]), run)
    for name in ("final", "summary.json"):  # as if killed after step 4's checkpoint
        target = run / name
        target.unlink() if target.is_file() else __import__("shutil").rmtree(target)
    summary = lifecycle.run(recipe_io.load(path, ["backend.name=toy"]), run)
    assert toy[1].steps_run == 2 and summary.resumed_from.endswith("step-000004")
    assert summary.metrics["train_loss"] == 1 / 64  # the value came back from the checkpoint
    with pytest.raises(GateError):  # a finished run re-run with a gate: a verdict, exit 3
        lifecycle.run(recipe_io.load(path, ["backend.name=toy"]), run, ["train.loss<0.001"])


def test_the_lifecycle_and_the_ondevice_engine_import_no_torch() -> None:
    code = (
        "import sys; import ortft.run.lifecycle, ortft.run.loop, ortft.backends.ondevice.engine, ortft.cli.app;"
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr


def test_the_resume_hint_resumes_even_when_the_recipe_says_never(tmp_path: Path) -> None:
    from ortft.run import rundir

    path = _recipe(tmp_path)
    hint = rundir.resume_command(recipe_io.load(path, ["checkpoint.resume=never"]), tmp_path)
    assert hint.endswith(f"checkpoint.resume=auto --output-dir {tmp_path}")
    assert "checkpoint.resume=never" not in hint
    assert "checkpoint.resume" not in rundir.resume_command(recipe_io.load(path), tmp_path)


# ---- a task registered from a test trains through the real PyTorch engine, loop untouched


def test_a_registered_task_trains_end_to_end(tmp_path: Path, monkeypatch) -> None:
    from typing import Literal

    from ortft import tasks

    class ParityOptions(tasks.TaskOptions):
        name: Literal["toy-parity"] = "toy-parity"

    class Parity(tasks.Task):
        """Whether a text has an even or an odd number of words."""

        name, auto_class, needs_logits = "toy-parity", "AutoModelForSequenceClassification", True
        eval_metrics = ("eval_loss", "eval_accuracy")

        def __init__(self, options: ParityOptions) -> None:
            pass

        def label_names(self, rows, data):
            return ["even", "odd"]

        def encode(self, rows, tokenizer, data, label2id) -> tasks.Encoded:
            texts = [str(r["text"]) for r in rows]
            enc = tokenizer(texts, max_length=data.max_length, truncation=True,
                            padding="max_length", return_tensors="np")  # fmt: skip
            labels = np.array([len(t.split()) % 2 for t in texts], dtype=np.int64)
            return tasks.Encoded({"input_ids": enc["input_ids"].astype(np.int64),
                                  "attention_mask": enc["attention_mask"].astype(np.int64),
                                  "labels": labels})  # fmt: skip

        def metrics(self, loss, logits, labels):
            pred, gold = np.concatenate([lg.argmax(-1) for lg in logits]), np.concatenate(labels)
            return {"loss": loss, "accuracy": float(np.mean(pred == gold))}

    monkeypatch.setattr(tasks, "_tasks", dict(tasks._tasks))  # the registration ends here
    tasks.register("toy-parity", ParityOptions, Parity)
    path = _recipe(tmp_path)
    loaded = recipe_io.load(path, ["task=toy-parity", "training.max_steps=2"])
    summary = lifecycle.run(loaded, output_dir=tmp_path / "run")
    assert summary.status == "completed" and summary.task == "toy-parity" and summary.steps == 2
    assert summary.backend.used == "torch" and "eval_accuracy" in summary.metrics
    assert (tmp_path / "run/final/config.json").exists()
