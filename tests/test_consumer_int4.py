"""The consumer tier's clients of a decoder's weight-only int4 file (``--quantize int4``, marker
``consumer``): transformers.js's ``dtype: "q4"`` (onnx/model_q4.onnx, a link to
model.int4.onnx) and onnxruntime-genai's ``int4/`` folder open the task matrix's causal-lm
(a tiny Llama) int4 export as ortft wrote it, and generate greedily the text ``ortft predict``'s
generation loop gives on model.int4.onnx itself. The card's q4 snippet runs verbatim.

Each check first makes sure it can tell the files apart: on these prompts the int4 file
generates other tokens than model.onnx, so a client that opened the fp32 file would fail.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
from typing import Any

import pytest
from test_consumer import _consumer, _node, _predict, ort_session
from test_consumer_genai import CLIENT as GENAI_CLIENT
from test_task_matrix import Matrix

from ortft.families.generation import genai

pytestmark = [pytest.mark.consumer, pytest.mark.xdist_group("task-matrix")]

# new tokens per prompt: past the first few, where the tiny Llama's int4 and fp32 files part
NEW = 16


@pytest.fixture(scope="module")
def int4(task_matrix: Matrix) -> dict[str, Any]:
    """The shared int4 export (``Matrix.int4``), its prompts, and what ``ortft predict``'s
    generation loop gives on model.int4.onnx and on model.onnx (``ortft predict`` itself)."""
    from ortft.families.generation import predict
    from ortft.inference.evaluate import open_model

    folder, inputs = task_matrix.int4("causal-lm"), task_matrix.inputs("causal-lm")
    texts = [x for x in inputs.read_text().splitlines() if x.strip()]
    m = dataclasses.replace(open_model(folder), _model=ort_session(folder / "model.int4.onnx"))
    want = list(predict.decoder(m, texts, NEW))
    fp32 = _predict(folder, inputs, NEW)
    assert [w["generated"] for w in want] != [f["generated"] for f in fp32]  # tells them apart
    return {"folder": folder, "texts": texts, "want": want, "model": m}


def test_transformers_js_q4_generates_what_ortft_generates_on_int4(
    int4: dict[str, Any], node_modules: str
) -> None:
    """``pipeline("text-generation", folder, {dtype: "q4"})`` opens onnx/model_q4.onnx (the
    link to model.int4.onnx: MatMulNBits in onnxruntime-node) and generates its greedy text."""
    folder = int4["folder"]
    options = {"max_new_tokens": NEW, "do_sample": False, "return_full_text": False}
    options["add_special_tokens"] = False
    job = {"task": "text-generation", "folder": str(folder), "dtype": "q4", "options": options}
    job["inputs"] = int4["texts"]
    got = _node(node_modules, job, folder.parent)
    assert [g["output"][0]["generated_text"] for g in got] == [w["generated"] for w in int4["want"]]


def test_card_q4_snippet_runs_verbatim(int4: dict[str, Any], node_modules: str) -> None:
    """The card's second transformers.js snippet (``dtype: "q4"``), run from the folder,
    prints the text ortft's loop generates on model.int4.onnx for the card's prompt."""
    from ortft.export import js_card
    from ortft.families.generation import card, predict

    folder, m = int4["folder"], int4["model"]
    code = js_card.card_js((folder / "README.md").read_text(), "q4")
    modules = folder.parent / "node_modules"  # where Node looks from the folder
    if not modules.exists():
        modules.symlink_to(node_modules)
    res = subprocess.run(
        ["node", "--input-type=module", "-e", code],
        capture_output=True, text=True, timeout=300, check=False, cwd=folder,
    )  # fmt: skip
    assert res.returncode == 0, (res.stderr[-3000:], code)
    report = json.loads((folder / "export.json").read_text())
    _, args, options = m.spec.js_call(m.tokenizer, report)  # the call the card shows
    assert args == [m.spec.prompt(card.example(), m.tokenizer)]
    (want,) = predict.decoder(m, [card.example()], options["max_new_tokens"])
    assert json.loads(res.stdout) == [{"generated_text": want["generated"]}], code


def test_genai_int4_folder_generates_what_ortft_generates_on_int4(
    int4: dict[str, Any], consumer_python: str
) -> None:
    """``og.Model(folder / "int4")`` (its genai_config.json names model.int4.onnx) generates
    greedily, one prompt at a time, the tokens ortft's loop generates on model.int4.onnx."""
    folder = int4["folder"]
    report = json.loads((folder / "export.json").read_text())
    sub = folder / report["genai"]["int4"]["folder"]
    assert json.loads((sub / genai.FILE).read_text())["model"]["decoder"]["filename"] == (
        "model.int4.onnx"
    )
    prompts = folder.parent / "genai-int4-prompts.jsonl"
    prompts.write_text("".join(json.dumps({"text": t}) + "\n" for t in int4["texts"]))
    out = _consumer(consumer_python, "-I", GENAI_CLIENT, sub, prompts, NEW)
    got = [json.loads(x) for x in out.splitlines()]
    assert all(g.pop("same_prompt_ids") for g in got), got
    assert got == [{k: w[k] for k in ("generated", "new_tokens")} for w in int4["want"]]
    assert all(w["new_tokens"] > 0 for w in int4["want"])
