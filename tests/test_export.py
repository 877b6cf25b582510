"""`ortft export`: tiny BERT / GPT-2 models built here (no training, no downloads), exported with
every option through the real CLI in a subprocess, then checked from the written folder."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import run_cli
from typer.testing import CliRunner

from ortft.cli.app import app
from ortft.env import ort_training

TEXTS = [
    "the cat sat on a mat while dogs ran",
    "great fun movie loved the acting",
    "boring and dull terrible plot",
    "birds sang over trees in parks",
] * 10


def _save_tiny(path: Path, kind: str) -> Path:
    import torch
    from transformers import (
        BertConfig,
        BertForSequenceClassification,
        BertModel,
        GPT2Config,
        GPT2LMHeadModel,
    )

    from ortft.backends.torch.models import train_tokenizer
    from ortft.recipe.schema import TrainTokenizer

    torch.manual_seed(0)
    if kind == "gpt2":
        tok = train_tokenizer(TEXTS, TrainTokenizer(kind="byte-bpe", vocab_size=300))
        model = GPT2LMHeadModel(
            GPT2Config(
                vocab_size=len(tok),
                n_embd=32,
                n_layer=2,
                n_head=2,
                n_positions=64,
                resid_pdrop=0.0,
                embd_pdrop=0.0,
                attn_pdrop=0.0,
                bos_token_id=tok.eos_token_id,
                eos_token_id=tok.eos_token_id,
            )
        )
    else:
        tok = train_tokenizer(TEXTS, TrainTokenizer(kind="wordpiece", vocab_size=200))
        cls = BertModel if kind == "bert-headless" else BertForSequenceClassification
        model = cls(
            BertConfig(
                vocab_size=len(tok),
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=2,
                intermediate_size=64,
                num_labels=2,
                hidden_dropout_prob=0.0,
                attention_probs_dropout_prob=0.0,
                pad_token_id=tok.pad_token_id,
            )
        )
    # as a pretrained tokenizer may (MiniLM's does): fixed padding, which the export drops
    tok.backend_tokenizer.enable_padding(length=48, pad_id=tok.pad_token_id or 0)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _cli(*args: object) -> subprocess.CompletedProcess:
    # a subprocess: ORT wants real stdout/stderr file descriptors, which CliRunner does not have
    return run_cli(*args, timeout=600, env={"OMP_NUM_THREADS": "1"})


@pytest.fixture(scope="module", params=["bert", "gpt2"])
def exported(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, dict]:
    base = tmp_path_factory.mktemp(request.param)
    src = _save_tiny(base / "model", request.param)
    out = base / "out"
    proc = _cli(
        "export",
        src,
        "-o",
        out,
        "--optimize",
        "--fp16",
        "--quantize",
        "int8",
        # the training artifacts need onnxruntime.training (the ort profile); the rest of this
        # export is checked on both profiles
        *(["--training-artifacts"] if ort_training.installed() else []),
        "--json",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out, json.loads(proc.stdout)


def test_parity_within_tolerance(exported):
    out, report = exported
    assert report["passed"] and report["failures"] == []
    assert (
        report["parity"]["max_abs_diff"] <= 1e-4 and report["parity"]["prediction_agreement"] == 1.0
    )
    on_disk = json.loads((out / "export.json").read_text())
    assert on_disk["format_version"] == 3 and on_disk["opset"] == 20
    assert on_disk["files"] == {
        "model": "model.onnx",
        "optimized": "model.opt.onnx",
        "fp16": "model.fp16.onnx",
        "int8": "model.int8.onnx",
        **({"training": "training/"} if ort_training.installed() else {}),
        "card": "README.md",
    }
    assert on_disk["ir_version"] >= 7
    import torch
    from packaging.version import Version

    # the exporter is recorded with the torch that ran it, and why it was the one used
    assert on_disk["exporter"]["name"] == "torchscript"
    assert on_disk["exporter"]["torch"] == torch.__version__.split("+")[0]
    dynamo_default = Version(torch.__version__).release >= (2, 9)  # torch 2.9 made it the default
    assert ("defaults to its dynamo exporter" in on_disk["exporter"]["why"]) == dynamo_default
    runtime = "onnxruntime-training" if ort_training.installed() else "onnxruntime"
    assert on_disk["runtimes"][0]["package"] == runtime
    assert not list(out.parent.glob(".out.tmp-*")) and not (out.parent / "out.failed").exists()


def test_folder_is_self_contained(exported, tmp_path):
    import onnxruntime as ort
    from transformers import AutoConfig, AutoTokenizer

    out, report = exported
    copy = shutil.copytree(out, tmp_path / "elsewhere")
    tok = AutoTokenizer.from_pretrained(copy)
    assert AutoConfig.from_pretrained(copy).model_type == report["model_type"]
    enc = tok(
        ["the cat sat", "great fun movie loved the acting"], padding=True, return_tensors="np"
    )
    sess = ort.InferenceSession(str(copy / "model.onnx"), providers=["CPUExecutionProvider"])

    def past(batch: int) -> dict[str, np.ndarray]:  # GPT-2's KV cache: empty at the first step
        return {
            i.name: np.zeros((batch, i.shape[1], 0, i.shape[3]), np.float32)
            for i in sess.get_inputs()
            if i.name.startswith("past_key_values")
        }

    assert bool(past(1)) == (report["model_type"] == "gpt2") == report.get("kv_cache", False)
    logits = sess.run(
        ["logits"],
        {
            "input_ids": enc["input_ids"].astype(np.int64),
            "attention_mask": enc["attention_mask"].astype(np.int64),
            **past(2),
        },
    )[0]
    assert logits.shape[0] == 2 and np.isfinite(logits).all()
    # the mask is in the graph: a padded row gives the same logits as the row alone
    alone = sess.run(
        ["logits"],
        {
            "input_ids": enc["input_ids"][:1, : enc["attention_mask"][0].sum()].astype(np.int64),
            "attention_mask": np.ones((1, enc["attention_mask"][0].sum()), np.int64),
            **past(1),
        },
    )[0]
    np.testing.assert_allclose(
        logits[0, : alone.shape[1]] if logits.ndim == 3 else logits[0], alone[0], atol=1e-5
    )


def test_tokenizer_has_no_fixed_padding(exported):
    """A plain `tokenizers` client gets as many ids as the text has, truncated at the model's
    limit, and the card's snippet runs as written (from the folder)."""
    from tokenizers import Tokenizer

    out, report = exported
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    assert len(tok.encode("the cat sat").ids) < 10
    limit = report["tokenizer"]["truncation"]
    assert limit == 64 if report["model_type"] == "gpt2" else limit == 512
    assert len(tok.encode(" ".join(["cat"] * 2 * limit)).ids) == limit
    from ortft.export.deploy import card_snippet

    code = card_snippet((out / "README.md").read_text())
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=out, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip()


def test_optimize_fp16_int8_are_valid_and_reported(exported):
    import onnx

    out, report = exported
    for name in ("model.onnx", "model.opt.onnx", "model.fp16.onnx", "model.int8.onnx"):
        onnx.checker.check_model(str(out / name))
    opt = report["optimize"]
    assert opt["passed"] and opt["nodes_after"] < opt["nodes_before"]
    for kind in ("fp16", "int8"):
        rep = report[kind]
        assert rep["passed"] and rep["size_ratio"] < 1.0
        assert rep["prediction_agreement"] >= rep["min_agreement"]
        assert rep["accuracy_against"] == "fp32 predictions"  # no labels: synthetic samples
    assert set(report["latency"]["ms"]) == {"fp32", "optimized", "fp16", "int8"}


@pytest.mark.ort
def test_training_artifacts_train_with_falling_loss(exported):
    out, report = exported
    t = report["training"]
    assert {"checkpoint", "training_model.onnx", "eval_model.onnx", "optimizer_model.onnx"} <= set(
        p.name for p in (out / "training").iterdir()
    )
    assert t["opset"] == 16 and t["frozen_parameters"] == 0
    losses = t["check"]["losses"]
    assert len(losses) == 3 and losses[0] > losses[1] > losses[2]


@pytest.mark.ort
def test_trainable_patterns_freeze_the_rest(tmp_path):
    """What the ort-ondevice backend will call: only the classifier head trains."""
    from onnxruntime.training import api
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from ortft.backends.ondevice import artifacts
    from ortft.export import exporter as export

    src = _save_tiny(tmp_path / "model", "bert")
    model = AutoModelForSequenceClassification.from_pretrained(src, attn_implementation="eager")
    tok = AutoTokenizer.from_pretrained(src)
    feeds = export.parity_feeds(None, tok, 8)
    example = dict(
        zip(
            ("input_ids", "attention_mask"),
            (t.numpy() for t in export._tracing_example(feeds, tok)),
            strict=True,
        )
    )
    art = tmp_path / "training"
    rep = artifacts.generate_training_artifacts(
        model,
        "sequence-classification",
        art,
        artifacts.training_feeds(example, "sequence-classification", 2),
        trainable=["classifier.*"],
    )
    assert rep["trainable_parameters"] == 2 and rep["frozen_parameters"] > 30
    state = api.CheckpointState.load_checkpoint(str(art / "checkpoint"))
    assert {n for n, p in state.parameters if p.requires_grad} == {
        "classifier.weight",
        "classifier.bias",
    }
    check = artifacts.check_training_artifacts(
        art, artifacts.training_feeds(feeds, "sequence-classification", 2), lr=1e-2
    )
    assert check["passed"], check


def test_trainable_pattern_that_matches_nothing_is_an_input_error():
    from ortft.backends.ondevice import artifacts
    from ortft.core.errors import InputError

    with pytest.raises(InputError, match="matches no parameter"):
        artifacts.select_trainable(["bert.embeddings.word_embeddings.weight"], ["clasifier.*"])


# --------------------------------------------------------------------------- bad input


runner = CliRunner()


def _invoke(*args: object):
    return runner.invoke(app, ["export", *map(str, args)])


def test_missing_source(tmp_path):
    res = _invoke(tmp_path / "nope")
    assert res.exit_code == 2 and "not found" in res.stderr


def test_non_model_source(tmp_path):
    (tmp_path / "empty").mkdir()
    res = _invoke(tmp_path / "empty")
    assert res.exit_code == 2 and "no config.json" in res.stderr
    (tmp_path / "file.txt").write_text("x")
    assert _invoke(tmp_path / "file.txt").exit_code == 2


def test_unwritable_or_foreign_output(tmp_path):
    src = _save_tiny(tmp_path / "model", "bert")
    (tmp_path / "a-file").write_text("x")
    res = _invoke(src, "-o", tmp_path / "a-file" / "out")
    assert res.exit_code == 2 and "cannot" in res.stderr
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    res = _invoke(src, "-o", tmp_path / "busy")
    assert res.exit_code == 2 and "not an ortft export" in res.stderr
    assert (tmp_path / "busy" / "notes.txt").read_text() == "mine"


def test_unsupported_architecture(tmp_path):
    src = _save_tiny(tmp_path / "model", "bert-headless")  # a head no task has: pre-training
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(
        json.dumps({**config, "architectures": ["BertForPreTraining"]})
    )
    res = _invoke(src, "-o", tmp_path / "out")
    assert res.exit_code == 2 and "unsupported model" in res.stderr
    assert not (tmp_path / "out").exists()


def test_option_mistakes_are_usage_errors(tmp_path):
    assert _invoke(tmp_path, "--trainable", "classifier.*").exit_code == 2
    res = _invoke(tmp_path, "--quantize", "int2")
    assert res.exit_code == 2 and "choose int8 or int4" in res.stderr


def test_parity_failure_leaves_nothing_under_the_final_name(tmp_path):
    src = _save_tiny(tmp_path / "model", "gpt2")
    out = tmp_path / "out"
    proc = _cli("export", src, "-o", out, "--tolerance", "1e-15")
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "parity" in proc.stderr.strip().splitlines()[-1]
    assert not out.exists()
    rejected = json.loads((tmp_path / "out.failed" / "export.json").read_text())
    assert rejected["passed"] is False and not rejected["parity"]["passed"]
