"""End to end: `ortft train` on tiny models, both backends, checkpoints, resume, final/, ONNX."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import (
    DEFAULT_BACKEND,
    tiny_causal_lm,
    tiny_classifier,
    write_classification_csv,
    write_corpus,
    write_recipe,
)
from helpers import losses, run_cli, summary


def train(*args: str) -> tuple[int, str, str]:
    """The real CLI in a subprocess: real stdout/stderr file descriptors, as users run it.

    (ORTModule redirects the OS-level stdout/stderr while it exports, which needs real
    file descriptors; an in-process CliRunner has none.)
    """
    res = run_cli("train", *args, env={"NO_COLOR": "1"}, timeout=600)
    return res.returncode, res.stdout, res.stderr


@pytest.mark.ort
def test_ort_and_torch_agree_on_classification(cls_recipe: Path, tmp_path: Path) -> None:
    """Dropout off: ORTModule (eager attention) and PyTorch (sdpa) follow the same losses."""
    ort_dir, torch_dir = tmp_path / "ort", tmp_path / "torch"
    code, out, err = train(str(cls_recipe), "--output-dir", str(ort_dir))
    assert code == 0, err
    assert out.strip() == str(ort_dir)  # stdout: just the run path
    code, _, err = train(str(cls_recipe), "backend.name=torch", "--output-dir", str(torch_dir))
    assert code == 0, err
    a, b = losses(ort_dir), losses(torch_dir)
    assert len(a) == len(b) == 5
    # measured: agreement to ~1e-7; 1e-4 relative leaves room for kernel differences
    assert a == pytest.approx(b, rel=1e-4)
    s = summary(ort_dir)
    assert s["status"] == "completed"
    assert s["backend"]["requested"] == "ort" and s["backend"]["used"] == "ort"
    assert s["backend"]["fallback"] is False
    assert s["backend"]["ort_exports"] >= 1  # ORT really ran: it exported the graph
    # fixed-shape batches: one training export plus one for eval, never one per step
    assert s["backend"]["ort_exports"] <= 2
    assert summary(torch_dir)["backend"] == {
        **summary(torch_dir)["backend"],
        "used": "torch",
        "ort_exports": 0,
    }


def test_run_directory_layout(cls_recipe: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    code, _, err = train(
        str(cls_recipe),
        "checkpoint.save_every=2",
        "checkpoint.keep_last=2",
        "--output-dir",
        str(run),
        "--json",
    )
    assert code == 0, err
    assert {p.name for p in run.iterdir()} >= {
        "final",
        "onnx",
        "summary.json",
        "metrics.jsonl",
        "tokenizer",
        "step-000002",
        "step-000004",
    }
    ckpt = {p.name for p in (run / "step-000004").iterdir()}
    assert ckpt == {
        "model.safetensors",
        "optimizer.pt",
        "scheduler.pt",
        "rng.pt",
        "recipe.yaml",
        "state.json",
        "manifest.json",
    }
    manifest = json.loads((run / "step-000004" / "manifest.json").read_text())
    assert manifest["format_version"] == 1 and set(manifest["files"]) == ckpt - {"manifest.json"}
    final = {p.name for p in (run / "final").iterdir()}
    assert {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "recipe.yaml",
        "README.md",
        "summary.json",
    } <= final
    # the saved recipe re-validates from anywhere (input paths were made absolute)
    check = run_cli("validate", str(run / "final" / "recipe.yaml"), cwd="/", timeout=None)
    assert check.returncode == 0, check.stderr
    config = json.loads((run / "final" / "config.json").read_text())
    assert config["id2label"] == {"0": "neg", "1": "pos"}
    onnx_dir = {p.name for p in (run / "onnx").iterdir()}
    assert {"model.onnx", "export.json", "tokenizer.json", "config.json"} <= onnx_dir
    # the export made after ORTModule training is plain ONNX: it runs in a fresh process
    # without ORTModule (ORTModule's ATen symbolics must not leak into it)
    check = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, numpy as np, onnx, onnxruntime as ort\n"
            "m = onnx.load(sys.argv[1]); assert not [n for n in m.graph.node if n.domain], 'custom ops'\n"
            "s = ort.InferenceSession(sys.argv[1], providers=['CPUExecutionProvider'])\n"
            "x = np.ones((2, 16), dtype=np.int64); print(s.run(None, {'input_ids': x, 'attention_mask': x})[0].shape)",
            str(run / "onnx" / "model.onnx"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert check.returncode == 0, check.stderr
    export = json.loads((run / "onnx" / "export.json").read_text())
    assert export["parity"]["passed"] and export["parity"]["max_abs_diff"] < 1e-4
    s = summary(run)
    for key in (
        "format_version",
        "status",
        "backend",
        "steps",
        "epochs",
        "metrics",
        "throughput",
        "wall_time_s",
        "paths",
        "provenance",
    ):
        assert key in s
    assert s["steps"] == 5 and s["metrics"]["eval_accuracy"] is not None
    packages = s["provenance"]["packages"]  # Python 3.12's lock has the -cpu build instead
    training = packages["onnxruntime-training"] or packages["onnxruntime-training-cpu"]
    # the ort profile's pin; the current profile has no training build
    assert training == ("1.19.2" if DEFAULT_BACKEND == "ort" else None)
    assert len(s["provenance"]["recipe_sha256"]) == 64


def test_resume_reproduces_uninterrupted_run(tmp_path: Path) -> None:
    """Stop after the step-3 checkpoint, resume: the same losses as one uninterrupted run."""
    write_classification_csv(tmp_path / "train.csv")
    recipe = tiny_classifier("train.csv", backend="torch", max_steps=6)
    recipe["model"]["dropout"] = 0.1  # dropout on: the RNG state must be restored too
    recipe["checkpoint"] = {"save_every": 3, "keep_last": 3}
    path = write_recipe(tmp_path / "r.yaml", recipe)
    full, cut = tmp_path / "full", tmp_path / "cut"
    assert train(str(path), "--output-dir", str(full))[0] == 0
    assert train(str(path), "--output-dir", str(cut))[0] == 0
    # make `cut` look like a run killed right after step 3's checkpoint
    for name in ("final", "onnx", "step-000006", "summary.json"):
        target = cut / name
        shutil.rmtree(target) if target.is_dir() else target.unlink()
    code, _, err = train(str(path), "--output-dir", str(cut))
    assert code == 0, err
    assert "resuming from" in err
    assert summary(cut)["resumed_from"].endswith("step-000003")
    assert losses(cut) == pytest.approx(losses(full), abs=1e-6)
    assert len(losses(cut)) == 6


def test_finished_run_is_not_retrained(cls_recipe: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert (
        train(
            str(cls_recipe), "backend.name=torch", "export.enabled=false", "--output-dir", str(run)
        )[0]
        == 0
    )
    before = (run / "summary.json").read_text()
    code, out, err = train(
        str(cls_recipe), "backend.name=torch", "export.enabled=false", "--output-dir", str(run)
    )
    assert code == 0
    assert "already holds a finished run" in err
    assert (run / "summary.json").read_text() == before


@pytest.mark.ort
def test_causal_lm_on_ort(tmp_path: Path) -> None:
    write_corpus(tmp_path / "corpus.txt")
    path = write_recipe(tmp_path / "lm.yaml", tiny_causal_lm("corpus.txt"))
    run = tmp_path / "run"
    code, out, err = train(str(path), "--output-dir", str(run), "--json")
    assert code == 0, err
    s = json.loads(out)
    assert s["backend"]["used"] == "ort" and not s["backend"]["fallback"]
    assert s["metrics"]["eval_perplexity"] > 1
    assert s["export"]["parity"]["passed"]
    # GPT-2 tokenizer trained here: saved with the model so final/ is usable on its own
    assert (run / "final" / "tokenizer.json").exists()


@pytest.mark.ort
def test_causal_lm_backends_agree(tmp_path: Path) -> None:
    write_corpus(tmp_path / "corpus.txt")
    path = write_recipe(tmp_path / "lm.yaml", tiny_causal_lm("corpus.txt"))
    a, b = tmp_path / "a", tmp_path / "b"
    assert (
        train(str(path), "export.enabled=false", "data.eval_fraction=0", "--output-dir", str(a))[0]
        == 0
    )
    assert (
        train(
            str(path),
            "export.enabled=false",
            "data.eval_fraction=0",
            "backend.name=torch",
            "--output-dir",
            str(b),
        )[0]
        == 0
    )
    assert losses(a) == pytest.approx(losses(b), rel=1e-4)


def test_second_run_reuses_tokenized_data(cls_recipe: Path, tmp_path: Path) -> None:
    args = [str(cls_recipe), "backend.name=torch", "export.enabled=false", "training.max_steps=1"]
    assert train(*args, "--output-dir", str(tmp_path / "a"))[0] == 0
    code, _, err = train(*args, "--output-dir", str(tmp_path / "b"))
    assert code == 0
    assert "cache hit" in err
