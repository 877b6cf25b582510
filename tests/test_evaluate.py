"""Metrics, `ortft eval` (PyTorch vs its ONNX export) and `ortft predict` on tiny models."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import (
    save_pretrained_classifier,
    tiny_causal_lm,
    tiny_classifier,
    write_classification_csv,
    write_corpus,
    write_recipe,
)
from helpers import run_cli
from typer.testing import CliRunner

from ortft.cli.app import app
from ortft.inference.evaluate import cross_entropy_sum
from ortft.tasks import get as get_task


def invoke(*args: object):
    return CliRunner().invoke(app, [str(a) for a in args])


def train(recipe: Path, run: Path, *overrides: str) -> dict:
    res = run_cli(
        "train",
        str(recipe),
        *overrides,
        "--output-dir",
        str(run),
        "--json",
        timeout=600,
        env={"NO_COLOR": "1"},
    )
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


# --------------------------------------------------------------------------- metrics


def test_classification_metrics_on_known_predictions() -> None:
    task = get_task("sequence-classification")
    logits = [np.array([[2.0, 0.0], [0.0, 1.0]]), np.array([[0.0, 3.0], [1.0, 0.0]])]
    labels = [np.array([0, 1]), np.array([0, 0])]  # predictions 0 1 1 0, gold 0 1 0 0
    m = task.metrics(0.5, logits, labels)
    assert m["accuracy"] == 0.75
    # class 0: tp 2, fp 0, fn 1 -> 0.8; class 1: tp 1, fp 1, fn 0 -> 2/3
    assert m["f1_macro"] == pytest.approx((0.8 + 2 / 3) / 2)
    assert get_task("causal-lm").metrics(2.0, [], [])["perplexity"] == pytest.approx(math.exp(2.0))


def test_cross_entropy_matches_torch() -> None:
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 5, 7)).astype(np.float32)
    labels = rng.integers(0, 7, size=(3, 5))
    labels[1, 3:] = -100
    total, n = cross_entropy_sum(logits, labels, causal=True)
    want = torch.nn.functional.cross_entropy(
        torch.from_numpy(logits[:, :-1]).reshape(-1, 7), torch.from_numpy(labels[:, 1:]).reshape(-1)
    )
    assert n == int((labels[:, 1:] != -100).sum())
    assert total / n == pytest.approx(float(want), rel=1e-6)


# --------------------------------------------------------------------------- classification


@pytest.fixture(scope="module")
def cls_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("cls")
    write_classification_csv(tmp / "train.csv")
    r = tiny_classifier("train.csv", backend="torch", max_steps=12, lr=3e-3)
    recipe = write_recipe(tmp / "r.yaml", r)
    train(recipe, tmp / "run")
    return tmp / "run"


def test_eval_agrees_between_pytorch_and_onnx(cls_run: Path) -> None:
    a, b = invoke("eval", cls_run, "--json"), invoke("eval", cls_run / "onnx", "--json")
    assert a.exit_code == 0, a.stderr
    assert b.exit_code == 0, b.stderr
    pt, ox = json.loads(a.stdout), json.loads(b.stdout)
    assert (pt["runtime"], ox["runtime"]) == ("pytorch", "onnxruntime")
    assert pt["examples"] == ox["examples"] == 16  # the run's held-out 10%
    assert pt["metrics"]["accuracy"] == ox["metrics"]["accuracy"]
    assert pt["metrics"]["f1_macro"] == ox["metrics"]["f1_macro"]
    assert pt["metrics"]["loss"] == pytest.approx(ox["metrics"]["loss"], abs=1e-5)
    # and with what training measured on the same split at its last step
    summary = json.loads((cls_run / "summary.json").read_text())
    assert pt["metrics"]["accuracy"] == summary["metrics"]["eval_accuracy"]
    assert pt["metrics"]["loss"] == pytest.approx(summary["metrics"]["eval_loss"], abs=1e-5)


def test_eval_on_another_file(cls_run: Path, tmp_path: Path) -> None:
    other = write_classification_csv(tmp_path / "other.csv", n=24, seed=7)
    res = invoke("eval", cls_run / "onnx", "--data", other)
    assert res.exit_code == 0, res.stderr
    assert f"data      {other} (24 examples)" in res.stdout
    assert "accuracy" in res.stdout and "f1_macro" in res.stdout


@pytest.mark.parametrize("exported", [False, True], ids=["pytorch", "onnx"])
def test_eval_of_a_plain_folder_keeps_to_its_positions(tmp_path: Path, exported: bool) -> None:
    """No recipe: --data's rows take the data section's 128 tokens, cut to the model's 64
    positions (padded past them, ONNX Runtime failed on the position ids' shape)."""
    texts = ["great fun movie loved it", "boring dull terrible plot"] * 10
    folder = save_pretrained_classifier(tmp_path / "bert", texts, max_positions=64)
    if exported:
        assert invoke("export", folder, "-o", tmp_path / "onnx").exit_code == 0
        folder = tmp_path / "onnx"
    data = write_classification_csv(tmp_path / "eval.csv", n=16)
    res = invoke("eval", folder, "--data", data, "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["examples"] == 16 and out["max_length"] == 64


def test_predict_one_json_line_per_input(cls_run: Path, tmp_path: Path) -> None:
    inputs = tmp_path / "in.txt"
    inputs.write_text('great fun movie\n\n{"text": "terrible plot", "id": 7}\nboring and dull\n')
    outs = []
    for source in (cls_run, cls_run / "onnx"):
        res = invoke("predict", source, "--input", inputs, "--json")
        assert res.exit_code == 0, res.stderr
        lines = [json.loads(line) for line in res.stdout.splitlines()]
        assert [r["index"] for r in lines] == [0, 1, 2]  # the blank line is not an input
        for r in lines:
            assert set(r["scores"]) == {"neg", "pos"}
            assert sum(r["scores"].values()) == pytest.approx(1.0)
            assert r["label"] == max(r["scores"], key=r["scores"].get)
        outs.append(lines)
    assert [r["label"] for r in outs[0]] == [r["label"] for r in outs[1]]
    for p, o in zip(outs[0], outs[1], strict=True):
        assert p["score"] == pytest.approx(o["score"], abs=1e-5)


def test_predict_bad_jsonl_is_a_usage_error(cls_run: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"txt": "no text field"}\n')
    res = invoke("predict", cls_run, "--input", bad)
    assert res.exit_code == 2
    assert "needs a string field 'text'" in res.stderr


def test_eval_of_a_folder_that_is_no_model(tmp_path: Path) -> None:
    res = invoke("eval", tmp_path)
    assert res.exit_code == 2 and "no final/, config.json or model.onnx" in res.stderr


# --------------------------------------------------------------------------- causal LM


def test_causal_lm_eval_and_generation_agree(tmp_path: Path) -> None:
    write_corpus(tmp_path / "corpus.txt")
    recipe = write_recipe(tmp_path / "lm.yaml", tiny_causal_lm("corpus.txt", backend="torch"))
    run = tmp_path / "run"
    summary = train(recipe, run)
    pt, ox = invoke("eval", run, "--json"), invoke("eval", run / "onnx", "--json")
    assert pt.exit_code == 0 and ox.exit_code == 0, pt.stderr + ox.stderr
    a, b = json.loads(pt.stdout)["metrics"], json.loads(ox.stdout)["metrics"]
    assert a["perplexity"] == pytest.approx(b["perplexity"], rel=1e-5)
    assert a["loss"] == pytest.approx(summary["metrics"]["eval_loss"], rel=1e-5)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("the cat sat\ndogs ran in\n")
    gen = [
        invoke("predict", src, "--input", prompts, "--json", "--max-new-tokens", 5)
        for src in (run, run / "onnx")
    ]
    assert all(g.exit_code == 0 for g in gen), [g.stderr for g in gen]
    rows = [[json.loads(line) for line in g.stdout.splitlines()] for g in gen]
    assert len(rows[0]) == 2 and all(0 < r["new_tokens"] <= 5 for r in rows[0])
    assert [r["generated"] for r in rows[0]] == [r["generated"] for r in rows[1]]


# --------------------------------------------------------------------------- the run's own task


def test_instruction_run_is_scored_as_instruction(tmp_path: Path) -> None:
    """eval takes the task from the run's recipe, not from the architecture (*LMHeadModel would
    say causal-lm, whose encoding needs a text column the instruction data does not have)."""
    data = Path(__file__).resolve().parent.parent / "recipes" / "data"
    r = tiny_causal_lm(str(data / "instructions-train.jsonl"), backend="torch", max_steps=3)
    r["task"] = {"name": "instruction", "template": "simple"}
    r["data"] = {"train": r["data"]["train"], "eval": str(data / "instructions-eval.jsonl")}
    r["data"]["max_length"] = 48
    run = tmp_path / "run"
    summary = train(write_recipe(tmp_path / "instr.yaml", r), run)
    for source in (run, run / "onnx"):
        res = invoke("eval", source, "--json")
        assert res.exit_code == 0, res.stderr
        out = json.loads(res.stdout)
        assert out["task"] == "instruction"
        assert out["metrics"]["loss"] == pytest.approx(summary["metrics"]["eval_loss"], rel=1e-4)
    export = json.loads((run / "onnx" / "export.json").read_text())
    assert export["task"] == "instruction"
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Is 3 larger than 2?\n")
    res = invoke("predict", run, "--input", prompts, "--json", "--max-new-tokens", 3)
    assert res.exit_code == 0, res.stderr
    assert json.loads(res.stdout.splitlines()[0])["new_tokens"] <= 3
