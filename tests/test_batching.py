"""Length-aware batches (data.padding, data.group_by_length) and the token-weighted loss.

Padding is right-sided, so a batch cut to its longest row holds the same real tokens as one
padded to max_length: the losses agree, every padding mode resumes exactly, ORTModule exports
no more graphs for batches of varying length, and a step's loss is the mean over its real tokens
however the step is split into micro-batches."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import WORDS, tiny_causal_lm, tiny_classifier, write_recipe
from helpers import losses, run_cli

from ortft.data import batches
from ortft.tasks import Encoded


def _varied_csv(path: Path, n: int = 96) -> Path:
    """Texts of 2 to 24 words: batches of very different lengths."""
    rng = random.Random(1)
    lines = ["text,label"]
    for _ in range(n):
        label = rng.choice(["pos", "neg"])
        k = rng.randint(2, 24)
        lines.append(" ".join(rng.choice(WORDS) for _ in range(k)) + f" {label},{label}")
    path.write_text("\n".join(lines) + "\n")
    return path


def _varied_jsonl(path: Path, n: int = 64) -> Path:
    """Causal-LM rows of 3 to 30 words, unpacked: micro-batches with different token counts."""
    rng = random.Random(2)
    rows = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 30))) for _ in range(n)]
    path.write_text("".join(json.dumps({"text": r}) + "\n" for r in rows))
    return path


def _train(recipe: Path, run: Path, *overrides: str) -> dict:
    res = run_cli("train", str(recipe), *overrides, "--output-dir", str(run), "--json", timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout)


def _encoded(lengths: list[int], width: int = 16) -> Encoded:
    n = len(lengths)
    mask = np.array([[1] * k + [0] * (width - k) for k in lengths], dtype=np.int64)
    return batches.with_lengths(
        Encoded({"input_ids": mask * 7, "attention_mask": mask, "labels": np.arange(n)})
    )


def test_padding_lengths_per_mode() -> None:
    longest = batches.Padding("longest", 128, 8)
    assert [longest.length(n) for n in (1, 8, 9, 127, 128)] == [8, 8, 16, 128, 128]
    buckets = batches.Padding("buckets", 128, 8, (32, 64, 96, 128))
    assert [buckets.length(n) for n in (1, 33, 96, 100)] == [32, 64, 96, 128]
    assert batches.Padding("max_length", 128).length(3) == 128


def test_cut_shortens_only_the_aligned_arrays() -> None:
    enc = _encoded([3, 5, 2])
    enc.arrays["target"] = np.ones((3, 16), dtype=np.int64)  # e.g. seq2seq labels: not aligned
    batch = batches.cut(
        enc.take(np.arange(3)), batches.Padding("longest", 16, 4), ("input_ids", "attention_mask")
    )
    assert batch["input_ids"].shape == (3, 8) and batch["attention_mask"].sum() == 10
    assert batch["target"].shape == (3, 16) and batch["labels"].shape == (3,)


def test_group_by_length_is_seeded_and_sorted_within_groups() -> None:
    enc = _encoded([random.Random(i).randint(1, 16) for i in range(40)])
    a = batches.epoch_order(enc, 2, 42, 0, True, group_by_length=True)
    assert np.array_equal(a, batches.epoch_order(enc, 2, 42, 0, True, group_by_length=True))
    assert sorted(a.tolist()) == list(range(40))
    assert not np.array_equal(a, batches.epoch_order(enc, 2, 42, 1, True, group_by_length=True))
    lengths = batches.lengths(enc)[a]
    assert all(lengths[i] >= lengths[i + 1] for i in range(39))  # one group of 50 x 2 rows


@pytest.mark.parametrize("overrides", [
    ["data.padding=longest", "data.group_by_length=true"],
    ["data.padding=buckets", "data.buckets=[8,16,24,32]"],
])  # fmt: skip
def test_every_padding_mode_resumes_exactly(tmp_path: Path, overrides: list[str]) -> None:
    _varied_csv(tmp_path / "train.csv")
    r = tiny_classifier("train.csv", backend="torch", max_steps=6, batch_size=8)
    r["model"]["dropout"] = 0.1
    r["data"]["max_length"] = 32
    r["checkpoint"] = {"save_every": 3}
    r["export"] = {"enabled": False}
    recipe, run = write_recipe(tmp_path / "r.yaml", r), tmp_path / "run"
    first = _train(recipe, run, *overrides)
    assert first["data"]["batch_shapes"] > 1  # the lengths really vary
    full = losses(run)
    for name in ("final", "step-000006", "summary.json"):  # as if killed after step 3
        target = run / name
        shutil.rmtree(target) if target.is_dir() else target.unlink()
    again = _train(recipe, run, *overrides)
    assert again["resumed_from"].endswith("step-000003")
    assert losses(run) == full  # the same batches, order and shapes: bit for bit


@pytest.mark.ort
def test_ort_exports_once_for_batches_of_every_length(tmp_path: Path) -> None:
    """ORTModule exports with dynamic batch and sequence axes: a new batch length is no new
    export. And the real tokens are the same whatever the padding: so are the losses."""
    _varied_csv(tmp_path / "train.csv")
    r = tiny_classifier("train.csv", backend="ort", max_steps=6, batch_size=8)
    r["data"]["max_length"] = 32
    r["export"] = {"enabled": False}
    recipe = write_recipe(tmp_path / "r.yaml", r)
    cut = _train(recipe, tmp_path / "cut", "data.padding=longest", "data.pad_to_multiple_of=1")
    full = _train(recipe, tmp_path / "full", "data.padding=max_length")
    assert cut["data"]["batch_shapes"] >= 4 and full["data"]["batch_shapes"] == 1
    assert cut["backend"]["ort_exports"] == full["backend"]["ort_exports"]
    assert cut["data"]["padding_fraction"] < full["data"]["padding_fraction"]
    assert losses(tmp_path / "cut") == pytest.approx(losses(tmp_path / "full"), rel=1e-5)


def test_a_steps_loss_is_the_mean_over_its_real_tokens(tmp_path: Path) -> None:
    """Causal LM, rows of very different lengths: 2 micro-batches of 4 rows accumulated make the
    same step as one batch of 8 (a mean of per-batch means would weight a short batch's tokens
    more than a long one's)."""
    _varied_jsonl(tmp_path / "train.jsonl")
    r = tiny_causal_lm("train.jsonl", backend="torch", max_steps=4, batch_size=8)
    r["data"]["packing"] = False
    r["data"]["shuffle"] = False
    r["export"] = {"enabled": False}
    recipe = write_recipe(tmp_path / "lm.yaml", r)
    whole = _train(recipe, tmp_path / "whole")
    split = _train(recipe, tmp_path / "split", "training.batch_size=4",
                   "training.gradient_accumulation_steps=2")  # fmt: skip
    assert whole["samples"] == split["samples"] == 32
    assert losses(tmp_path / "split") == pytest.approx(losses(tmp_path / "whole"), rel=1e-5)
