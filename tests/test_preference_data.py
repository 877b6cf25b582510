"""The preference recipes' data: recipes/data/preference-*.jsonl as scripts/make_task_data.py
writes them, and the under-trained start (recipes/data/preference-start/) that
scripts/make-preference-start.py builds."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "recipes" / "data"


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name.replace("-", "_"), ROOT / "scripts" / name)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rows(name: str) -> list[dict]:
    return [json.loads(line) for line in (DATA / name).read_text().splitlines()]


def test_recipes_data_is_what_make_task_data_writes() -> None:
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "make_task_data.py"), "--check"],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert res.returncode == 0, res.stderr
    names = set(_script("make_task_data.py").files())
    assert {"preference-train.jsonl", "preference-eval.jsonl", "LICENSE.txt"} <= names


def _pair(row: dict) -> tuple[str, str, str]:
    """(prompt, chosen, rejected) of a row in either form; a conversation's turns are checked."""
    if isinstance(row["chosen"], list):
        (user, good), (user2, bad) = row["chosen"], row["rejected"]
        assert user == user2 and user["role"] == "user"  # the shared prompt
        assert good["role"] == bad["role"] == "assistant"
        return user["content"], good["content"], bad["content"]
    return row["prompt"], row["chosen"], row["rejected"]


def _one_edit(right: list[str], wrong: list[str]) -> bool:
    """``wrong`` is ``right`` with one digit changed, two neighbours swapped or one dropped
    (doubled, in a two-digit answer: never a bare one-digit number)."""
    if len(wrong) == len(right) - 1:
        return len(wrong) > 1 and any(
            right[:i] + right[i + 1 :] == wrong for i in range(len(right))
        )
    if len(right) == 2 and len(wrong) == 3:
        return any(right[: i + 1] + right[i:] == wrong for i in range(2))
    diff = [i for i in range(len(right)) if right[i] != wrong[i]]
    swapped = len(diff) == 2 and diff[1] == diff[0] + 1 and right[diff[0]] == wrong[diff[1]]
    return len(diff) == 1 or (swapped and right[diff[1]] == wrong[diff[0]])


@pytest.mark.parametrize("split,n", [("train", 320), ("eval", 60)])
def test_preference_pairs_are_right_against_one_plausible_error(split: str, n: int) -> None:
    words = _script("make_task_data.py").NUMBERS
    rows = _rows(f"preference-{split}.jsonl")
    assert len(rows) == n
    conversations = sum(isinstance(r["chosen"], list) for r in rows)
    assert 0.1 * n < conversations < 0.4 * n  # both forms are exercised
    for row in rows:
        prompt, chosen, rejected = _pair(row)
        spoken = prompt.removeprefix("Write in digits: ").split()
        assert chosen.split() == [str(words.index(w)) for w in spoken]
        assert rejected != chosen and _one_edit(chosen.split(), rejected.split()), row


def test_held_out_prompts_are_new_and_the_sft_rows_are_the_chosen_answers() -> None:
    train = [_pair(r) for r in _rows("preference-train.jsonl")]
    held_out = [_pair(r) for r in _rows("preference-eval.jsonl")]
    assert len({p for p, _, _ in train + held_out}) == len(train) + len(held_out)
    for split, pairs in (("train", train), ("eval", held_out)):
        sft = _rows(f"preference-sft-{split}.jsonl")
        got = [
            (r["messages"][0]["content"], r["messages"][1]["content"])
            if "messages" in r
            else (r["prompt"], r["response"])
            for r in sft
        ]
        assert got == [(p, c) for p, c, _ in pairs]


def test_the_committed_start_is_under_trained_as_stated() -> None:
    """recipes/data/preference-start/ answers 40-70 % of the held-out prompts exactly (greedy)."""
    pytest.importorskip("torch")
    start = _script("make-preference-start.py")
    folder = DATA / "preference-start"
    assert sorted(p.name for p in folder.iterdir()) == sorted(start.KEEP)
    score = start.exact_match(folder)
    assert start.BAND[0] <= score <= start.BAND[1], score
