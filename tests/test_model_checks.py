"""A pretrained classification head meets the data's labels: kept when they are its own, rows
reordered when only the order differs, started afresh otherwise (and said so in summary.json).

The folders are tiny BertForSequenceClassification models saved here (conftest's
``save_pretrained_classifier``); the model is built in-process, as the engine builds it.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch
from conftest import (
    save_pretrained_classifier,
    tiny_classifier,
    write_classification_csv,
    write_recipe,
)
from helpers import run_cli, summary

from ortft.backends.torch import load_checks, models
from ortft.recipe import io as recipe_io

TEXTS = ["great fun movie indeed", "boring and dull really", "a real delight so", "terrible plot"]
AUTO = "AutoModelForSequenceClassification"


def build(tmp: Path, head_labels: tuple[str, ...], data_labels: list[str]):
    """(the checkpoint's own model, the one build_model makes for data_labels)."""
    from transformers import AutoModelForSequenceClassification

    folder = save_pretrained_classifier(tmp / "model", TEXTS, labels=head_labels)
    write_classification_csv(tmp / "train.csv", n=16)
    recipe = tiny_classifier("train.csv", backend="torch")
    recipe["model"] = {"name_or_path": "./model"}
    loaded = recipe_io.load(write_recipe(tmp / "r.yaml", recipe))
    tokenizer = models.load_tokenizer(loaded)
    built = models.build_model(loaded, AUTO, tokenizer, data_labels, attn="eager")
    return AutoModelForSequenceClassification.from_pretrained(folder), built


def test_plan_head_keeps_reorders_or_reinitialises() -> None:
    class Config:
        id2label = {0: "neg", 1: "pos"}

    assert load_checks.plan_head(Config(), ["neg", "pos"]).action == "kept"
    assert load_checks.plan_head(Config(), ["pos", "neg"]).action == "reordered"
    fresh = load_checks.plan_head(Config(), ["a", "b"])
    assert (fresh.action, fresh.resize) == ("reinitialised", False)
    assert load_checks.plan_head(Config(), list("abcde")).resize


def test_same_labels_keep_the_head(tmp_path: Path) -> None:
    old, new = build(tmp_path, ("neg", "pos"), ["neg", "pos"])
    assert torch.equal(old.classifier.weight, new.classifier.weight)
    assert load_checks.head_record(new)["action"] == "kept"


def test_labels_in_another_order_reorder_the_rows(tmp_path: Path) -> None:
    """Data label i keeps the class the checkpoint gave it: row i is the checkpoint's row of
    that name, and the saved config names the data's order."""
    old, new = build(tmp_path, ("pos", "neg"), ["neg", "pos"])
    for name in ("weight", "bias"):
        was, now = getattr(old.classifier, name), getattr(new.classifier, name)
        assert torch.equal(now[0], was[1]) and torch.equal(now[1], was[0])
    assert new.config.id2label == {0: "neg", 1: "pos"}
    assert load_checks.head_record(new) == {
        "old_labels": ["pos", "neg"],
        "new_labels": ["neg", "pos"],
        "action": "reordered",
    }


@pytest.mark.parametrize("labels", [["a", "b"], ["a", "b", "c", "d", "e"]])
def test_other_labels_start_a_fresh_head(tmp_path: Path, labels: list[str]) -> None:
    old, new = build(tmp_path, ("neg", "pos"), labels)
    assert new.classifier.weight.shape[0] == len(labels)
    if len(labels) == 2:  # the same shape loads: it must have been started afresh
        assert not torch.equal(old.classifier.weight, new.classifier.weight)
    # the body is the checkpoint's either way
    assert torch.equal(old.bert.embeddings.word_embeddings.weight,
                       new.bert.embeddings.word_embeddings.weight)  # fmt: skip
    assert load_checks.head_record(new)["action"] == "reinitialised"


def test_five_labels_on_a_two_label_checkpoint_train_and_say_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was transformers' ignore_mismatched_sizes traceback, exit 1."""
    monkeypatch.chdir(tmp_path)
    save_pretrained_classifier(tmp_path / "model", TEXTS)
    with open(tmp_path / "five.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["text", "label"])
        w.writerows([TEXTS[i % 4], "abcde"[i % 5]] for i in range(40))
    recipe = tiny_classifier("five.csv", backend="torch", max_steps=2)
    recipe["model"] = {"name_or_path": "./model"}
    recipe["export"] = {"enabled": False}
    path = write_recipe(tmp_path / "r.yaml", recipe)
    res = run_cli("train", path, "-o", tmp_path / "run", env={"NO_COLOR": "1"}, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr
    assert "classification head: the checkpoint's labels ['neg', 'pos'] are not" in res.stderr
    assert summary(tmp_path / "run")["backend"]["head"] == {
        "old_labels": ["neg", "pos"],
        "new_labels": ["a", "b", "c", "d", "e"],
        "action": "reinitialised",
    }
