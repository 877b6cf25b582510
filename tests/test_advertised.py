"""Advertised paths no other test reached, each checked where the value lands, not by exit 0.

`datasets` folders written by ``save_to_disk`` train, export and predict on the profile's
default backend (``ort`` on the ort profile) and ``torch``: a ``DatasetDict`` by ``data.split``
and ``data.eval_split``, a ``Dataset`` whole. The DatasetDict run also carries
``optimizer.betas`` (into the checkpoint's optimizer state), ``export.opset`` (the file's
``opset_import``) and, on ort, ``backend.log_level`` and ``backend.memory_optimization_level``
(ORTModule's banner on stderr names the level it runs); ``ortft export --opset`` and
``ortft eval --batch-size`` are run on it in this process.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import DEFAULT_BACKEND, NEG, POS, tiny_classifier, write_recipe
from helpers import run_cli, summary
from typer.testing import CliRunner

from ortft.cli.app import app

# the saved DatasetDict's splits: none is called "train", so a data.split that were not read
# would fail the run, and the eval split's size is none that eval_fraction would hold out
FIT, HELDOUT = 96, 12
TEXTS = [POS[0], NEG[1], POS[3], NEG[4]]


def _rows(n: int, seed: int) -> dict[str, list[str]]:
    rng = np.random.default_rng(seed)
    labels = [str(x) for x in rng.choice(["pos", "neg"], n)]
    texts = [f"{(POS if y == 'pos' else NEG)[rng.integers(5)]} indeed" for y in labels]
    return {"text": texts, "label": labels}


def _train(tmp: Path, recipe: dict, *overrides: str) -> tuple[Path, str]:
    out = tmp / "run"
    recipe_path = write_recipe(tmp / "r.yaml", recipe)
    res = run_cli("train", recipe_path, *overrides, "--output-dir", out, env={"NO_COLOR": "1"})
    assert res.returncode == 0, res.stderr[-3000:]
    return out, res.stderr


def _save_dict(folder: Path) -> dict[str, dict[str, list[str]]]:
    import datasets

    splits = {"fit": _rows(FIT, 0), "heldout": _rows(HELDOUT, 1), "test": _rows(5, 2)}
    dd = datasets.DatasetDict({k: datasets.Dataset.from_dict(v) for k, v in splits.items()})
    dd.save_to_disk(str(folder))
    return splits


@pytest.fixture(scope="module")
def dict_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """2 steps on the default backend from a saved DatasetDict, with the recipe fields checked
    below (ORTModule's own fields on ort only)."""
    tmp = tmp_path_factory.mktemp("dataset-dict")
    _save_dict(tmp / "saved")
    recipe = tiny_classifier("saved", max_steps=2)
    ortmodule = ["backend.log_level=WARNING", "backend.memory_optimization_level=1"]
    return _train(
        tmp,
        recipe,
        "data.split=fit",
        "data.eval_split=heldout",
        "optimizer.betas=[0.8,0.95]",
        "export.opset=17",
        "checkpoint.save_every=2",
        *(ortmodule if DEFAULT_BACKEND == "ort" else []),
    )


@pytest.fixture(scope="module")
def torch_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """2 steps on torch from a saved Dataset (one split: read whole, eval held out of it)."""
    import datasets

    tmp = tmp_path_factory.mktemp("torch-dataset")
    datasets.Dataset.from_dict(_rows(40, 3)).save_to_disk(str(tmp / "saved"))
    recipe = tiny_classifier("saved", backend="torch", max_steps=2)
    recipe["data"]["eval_fraction"] = 0.25
    return _train(tmp, recipe)


def _invoke(*args: object) -> str:
    res = CliRunner().invoke(app, [str(a) for a in args])
    assert res.exit_code == 0, (res.output, res.exception)
    return res.stdout


# --------------------------------------------------------------------------- datasets folders


def test_a_saved_datasetdict_trains_on_data_split_and_evaluates_on_eval_split(dict_run) -> None:
    run, stderr = dict_run
    assert f"data: {FIT} train / {HELDOUT} eval examples" in stderr
    s = summary(run)
    assert s["status"] == "completed" and s["backend"]["used"] == DEFAULT_BACKEND


def test_a_saved_dataset_is_read_whole(torch_run) -> None:
    run, stderr = torch_run
    assert "data: 30 train / 10 eval examples" in stderr
    assert summary(run)["status"] == "completed"


@pytest.mark.parametrize("which", ["dict_run", "torch_run"])
def test_saved_datasets_export_and_predict(which: str, request, tmp_path: Path) -> None:
    """final/ (PyTorch) and onnx/ (ONNX Runtime) give each text the same label and score."""
    run, _ = request.getfixturevalue(which)
    assert json.loads((run / "onnx" / "export.json").read_text())["passed"] is True
    inputs = tmp_path / "texts.txt"
    inputs.write_text("\n".join(TEXTS) + "\n")
    by_runtime = [
        [json.loads(line) for line in _invoke("predict", src, "-i", inputs, "--json").splitlines()]
        for src in (run, run / "onnx")
    ]
    torch_out, onnx_out = by_runtime
    assert len(torch_out) == len(onnx_out) == len(TEXTS)
    for a, b in zip(torch_out, onnx_out, strict=True):
        assert a["label"] in ("pos", "neg") and a["label"] == b["label"]
        assert a["score"] == pytest.approx(b["score"], abs=1e-4)


def test_a_saved_datasetdict_streams_its_split(tmp_path: Path) -> None:
    """data.streaming reads data.split of the folder, and data.eval_split is eval data a
    stream may have (no held-out share of a stream needed)."""
    from ortft import tasks
    from ortft.data.splits import load_splits
    from ortft.recipe.schema import Recipe

    splits = _save_dict(tmp_path / "saved")
    recipe = tiny_classifier("saved", max_steps=2)
    streamed = {"split": "fit", "eval_split": "heldout", "streaming": True}
    recipe["data"].update(streamed, label_names=["neg", "pos"])
    spec = Recipe.model_validate(recipe).data
    raw = load_splits(spec, tmp_path, tasks.get("sequence-classification"), seed=0)
    assert [r["text"] for r in raw.train] == splits["fit"]["text"]
    assert raw.eval is not None and [r["text"] for r in raw.eval] == splits["heldout"]["text"]


def test_eval_split_needs_a_source_with_splits(tmp_path: Path) -> None:
    """A saved Dataset or a csv has no split to name: one line, not its train rows again."""
    import datasets

    from ortft import tasks
    from ortft.core.errors import InputError
    from ortft.data.spec import DataSection
    from ortft.data.splits import load_splits

    datasets.Dataset.from_dict(_rows(8, 4)).save_to_disk(str(tmp_path / "one"))
    (tmp_path / "t.csv").write_text("text,label\na,pos\nb,neg\n")
    task = tasks.get("sequence-classification")
    for source, what in (("one", "a saved Dataset"), ("t.csv", "a csv file")):
        spec = DataSection(train=source, eval_split="heldout")
        with pytest.raises(InputError, match=f"eval_split 'heldout' names a split, but {what}"):
            load_splits(spec, tmp_path, task, seed=0)


# --------------------------------------------------------------------------- recipe fields


def test_optimizer_betas_are_the_optimizers(dict_run) -> None:
    import torch

    run, _ = dict_run
    state = torch.load(run / "step-000002" / "optimizer.pt", weights_only=True)
    assert [tuple(g["betas"]) for g in state["param_groups"]] == [(0.8, 0.95)] * 2


def _opset(path: Path) -> int:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))


def test_export_opset_is_the_files_opset(dict_run) -> None:
    run, _ = dict_run
    assert _opset(run / "onnx" / "model.onnx") == 17
    assert json.loads((run / "onnx" / "export.json").read_text())["opset"] == 17


@pytest.mark.ort
def test_ortmodule_runs_with_the_log_level_and_memory_optimization_level(dict_run) -> None:
    """At WARNING ORTModule prints its feature banner (at the default ERROR, nothing); the
    banner names the memory optimizer's level ORTModule runs with."""
    _, stderr = dict_run
    assert "ORTModule) is accelerating your model" in stderr
    assert "Memory Optimization Level: [TRANSFORMER_LAYERWISE_RECOMPUTE]" in stderr


# --------------------------------------------------------------------------- CLI options


def test_export_cli_opset(dict_run, tmp_path: Path) -> None:
    run, _ = dict_run
    _invoke("export", run, "-o", tmp_path / "onnx", "--opset", "16")
    assert _opset(tmp_path / "onnx" / "model.onnx") == 16


def test_eval_batch_size(dict_run, monkeypatch: pytest.MonkeyPatch) -> None:
    """The forwards are --batch-size rows each, over the run's eval split (data.eval_split)."""
    from ortft.inference import evaluate

    sizes: list[int] = []
    forward = evaluate.SavedModel.batch_logits

    def counted(self, batch):
        sizes.append(len(batch["labels"]))
        return forward(self, batch)

    monkeypatch.setattr(evaluate.SavedModel, "batch_logits", counted)
    run, _ = dict_run
    result = json.loads(_invoke("eval", run, "--batch-size", "5", "--json"))
    assert result["examples"] == HELDOUT and sizes == [5, 5, 2]
