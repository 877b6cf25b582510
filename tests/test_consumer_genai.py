"""The consumer tier's onnxruntime-genai check (marker ``consumer``): genai (requirements/
consumer.txt's pin, in the clean venv of scripts/consumer-env.sh) opens the task matrix's causal-lm
export (a tiny Llama) as ortft wrote it, through its genai_config.json, and generates greedily
the tokens ``ortft predict`` generates on the same export (tests/consumer_genai.py). The
architecture tier runs the same check on each decoder family genai runs (tests/test_archs.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_consumer import _consumer, _predict
from test_task_matrix import MAX_NEW, Matrix

from ortft.families.generation import genai

# one xdist group with tests/test_task_matrix.py: they share its trained runs (test_consumer.py)
pytestmark = [pytest.mark.consumer, pytest.mark.xdist_group("task-matrix")]

CLIENT = Path(__file__).resolve().parent / "consumer_genai.py"
TEXTS = ["the cat sat", "dogs ran in"]  # the task matrix's causal-lm inputs (_inputs)


def assert_genai_agrees(folder: Path, model_type: str, python: str, max_new: int) -> None:
    """genai, in the clean venv ``python``, opens ``folder`` and generates ``ortft predict``'s
    tokens for ``TEXTS`` (at most ``max_new`` each); genai's tokenizer encodes the prompts as
    the folder's tokenizer.json does."""
    report = json.loads((folder / "export.json").read_text())
    assert report["genai"] == {"config": genai.FILE, "model_type": model_type}, report["genai"]
    assert f"`{genai.FILE}` (model type {model_type})" in (folder / "README.md").read_text()
    inputs = folder.parent / "genai-inputs.txt"
    inputs.write_text("".join(t + "\n" for t in TEXTS))
    prompts = folder.parent / "genai-prompts.jsonl"
    prompts.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    want = _predict(folder, inputs, max_new)
    out = _consumer(python, "-I", CLIENT, folder, prompts, max_new)
    got = [json.loads(x) for x in out.splitlines()]
    assert len(got) == len(want) == len(TEXTS)
    for g, w in zip(got, want, strict=True):
        assert g["same_prompt_ids"], g  # genai's tokenizer reads ortft's tokenizer.json
        assert (g["generated"], g["new_tokens"]) == (w["generated"], w["new_tokens"]), (g, w)
        assert w["new_tokens"] > 0  # something was generated and compared


def test_genai_generates_what_predict_generates(task_matrix: Matrix, consumer_python: str) -> None:
    folder = task_matrix.run("causal-lm") / "onnx"
    assert_genai_agrees(folder, "llama", consumer_python, MAX_NEW)
