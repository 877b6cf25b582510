"""The task matrix: every task x {eval, predict} x {PyTorch final/, ONNX export onnx/}.

Each task trains one tiny model for 2 steps (seq2seq: SEQ2SEQ_STEPS) with export on (shared by
its cells, module scope).
An eval cell scores the run's eval split: the PyTorch numbers are the ones training reported in
summary.json (same eval variant, e.g. masked-lm's fixed masking; same metrics), the ONNX
numbers the PyTorch ones. A predict cell checks the output has the task's shape (a label per
text, a tag per word, an answer span of the context, filled masks, generated text), and the
ONNX predictions equal the PyTorch ones. A task ortft does not export (traits.SkipsExport) has
its ONNX cells skipped with that reason.

speech-recognition reads audio files: 16 committed spoken-digit clips, its predict input a
list of held-out clip paths; ONNX predicts (features.onnx, encoder, decoder) must equal PyTorch's
transcripts exactly. image-classification reads image files: its run has 6 classes (so top-5 accuracy is scored),
its predict input is a list of image paths. Its ONNX predict runs preprocess.onnx then
model.onnx, as a client does: the cell checks it equals the two graphs run by hand, and PyTorch
(the image processor) within the resize's one-pixel-step difference (IMAGE_ONNX_TOLERANCE).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    tiny_causal_lm,
    tiny_classifier,
    tiny_image_classifier,
    tiny_speech_recognizer,
    write_classification_csv,
    write_corpus,
    write_image_folder,
    write_recipe,
    write_speech_jsonl,
)
from helpers import run_cli, summary
from test_sentence_embedding import _recipe as sentence_embedding_recipe
from test_sentence_embedding import _rows as sentence_pairs
from test_tasks import DATA, RECIPES
from test_tasks import ROOT as REPO
from typer.testing import CliRunner

from ortft import tasks
from ortft.cli.app import app
from ortft.tasks import traits

TASKS = [
    "sequence-classification",
    "token-classification",
    "question-answering",
    "masked-lm",
    "causal-lm",
    "instruction",
    "seq2seq",
    "image-classification",
    "speech-recognition",
    "sentence-embedding",
    "image-text-to-text",
]
pytestmark = pytest.mark.xdist_group("task-matrix")  # see tests/test_consumer.py
MAX_NEW = 4  # generated tokens per prompt
RECIPES_DIR = REPO / "recipes"
IMAGE_CLASSES = tuple("abcdef")  # more than 5: eval scores top5_accuracy
# T5's steps: enough to write digits for number words ("five five" -> "5 5 5"), so the
# generation checks (ONNX, transformers.js) compare tokens that depend on the source text
SEQ2SEQ_STEPS = 60
# preprocess.onnx may put a resized pixel one 8-bit step off PIL's fixed-point resize
# (export.json preprocess.tolerance: 2/255 after normalising); end to end that moved the tiny
# ViT's logits by 1.2e-4 and its probabilities by 3.9e-5 at most (this run's 36 images,
# 10x12 -> 8x8; 3 classes, 6 steps: 1.7e-4 and 4.8e-5)
IMAGE_ONNX_TOLERANCE = 1e-3


TRAINED, INPUTS = ".trained", ".inputs"  # Matrix's marks: a task's run, its predict inputs

# image-text-to-text: the shipped recipe made tiny (1 layer, hidden 32, 8x8 digits in 2x2
# patches), on VLM_ROWS of its rows renamed to columns of the run's own (data.image_column,
# task.question_column, answer_column, messages_column), which ortft predict then reads
VLM = "image-text-to-text"
VLM_COLUMNS = {"image": "picture", "question": "ask", "answer": "reply", "messages": "chat"}
VLM_ROWS = 24
VLM_IMAGES = ("0004.png", "0007.png", "0009.png")  # the predict inputs' (held-out scans)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` across test processes (fcntl; released on exit)."""
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _recipe(task: str, tmp: Path) -> dict[str, Any]:
    if task == "sequence-classification":
        r = tiny_classifier(str(write_classification_csv(tmp / "train.csv", n=80)))
    elif task == "causal-lm":  # a Llama: onnxruntime-genai opens its export (test_consumer_genai)
        r = tiny_causal_lm(str(write_corpus(tmp / "corpus.txt", n=40)))
        r["model"]["from_config"]["architecture"] = "llama"
    elif task == "image-classification":
        r = tiny_image_classifier(
            str(write_image_folder(tmp / "imgs", per_class=6, classes=IMAGE_CLASSES))
        )
    elif task == "speech-recognition":
        r = tiny_speech_recognizer(str(write_speech_jsonl(tmp / "train.jsonl", n=16)))
    elif task == VLM:
        r = _vlm_recipe(tmp)
    elif task == "sentence-embedding":  # (anchor, positive) pairs, 20 % held out
        pairs = tmp / "pairs.jsonl"
        pairs.write_text("".join(json.dumps(r) + "\n" for r in sentence_pairs(40, seed=3)))
        r = sentence_embedding_recipe("torch")
        r["data"] = {**r["data"], "train": str(pairs)}
        del r["data"]["eval"]
    else:
        r = RECIPES[task]()
    r["data"]["eval_fraction"] = r["data"].get("eval_fraction", 0.2)
    r["data"]["max_eval_samples"] = 12  # few eval rows: a fast eval, still every code path
    r["training"].update(max_steps=2, batch_size=4)
    if task == "seq2seq":  # 2 steps leave T5 copying its start token (pad): empty outputs
        r["training"].update(max_steps=SEQ2SEQ_STEPS, lr=3e-3)

    r["backend"] = {"name": "torch"}
    return r


def _vlm_recipe(tmp: Path) -> dict[str, Any]:
    """recipes/image-text-to-text.yaml, tiny, on its first ``VLM_ROWS`` training rows (both
    kinds of question) under ``VLM_COLUMNS``' names, 20 % held out."""
    import yaml

    questions = DATA / "digit-questions"
    rows = []
    for line in (questions / "train.jsonl").read_text().splitlines()[:VLM_ROWS]:
        row = json.loads(line)
        row["image"] = str((questions / row["image"]).resolve())
        rows.append({VLM_COLUMNS[k]: v for k, v in row.items()})
    (tmp / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = yaml.safe_load((RECIPES_DIR / "image-text-to-text.yaml").read_text())
    r["model"]["from_config"].update(hidden_size=32, num_layers=1, num_heads=2)
    r["task"].update(vision_hidden_size=32, vision_layers=1, vision_heads=2, generate_samples=4)
    r["task"].update({f"{k}_column": VLM_COLUMNS[k] for k in ("question", "answer", "messages")})
    r["task"]["max_new_tokens"] = MAX_NEW
    r["data"] = {"train": "rows.jsonl", "image_column": VLM_COLUMNS["image"], "max_length": 48}
    r["training"].update(epochs=None, log_every=1, eval_every=None)
    del r["checkpoint"]  # no checkpoint before final/
    return r


def _vlm_inputs(tmp: Path) -> Path:
    """A question row and a conversation row (its last assistant turn answered again) on
    copies of held-out scans, in the run's columns, paths relative to the file."""
    (tmp / "imgs").mkdir(exist_ok=True)
    for name in VLM_IMAGES:
        shutil.copy(DATA / "digits" / "images" / name, tmp / "imgs" / name)
    chat = [
        {"role": "user", "content": [{"type": "image"},
                                     {"type": "text", "text": "Is this digit even or odd?"}]},
        {"role": "assistant", "content": "odd"},
    ]  # fmt: skip
    c = VLM_COLUMNS
    rows = [
        {c["image"]: f"imgs/{VLM_IMAGES[0]}", c["question"]: "Which digit is this?"},
        {c["image"]: f"imgs/{VLM_IMAGES[1]}", c["messages"]: chat},
        {c["image"]: f"imgs/{VLM_IMAGES[2]}", c["question"]: "Which digit is this?"},
    ]
    path = tmp / "inputs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _inputs(task: str, tmp: Path) -> Path:
    """A few predict inputs in the task's format (plain lines and JSONL; images: a list of
    paths relative to it, with a blank line and padding that predict skips and strips)."""
    if task == "image-classification":
        path = tmp / "paths.txt"
        path.write_text("imgs/a/000.png\n\n  imgs/c/001.png \nimgs/f/005.png\n")
        return path
    if task == VLM:
        return _vlm_inputs(tmp)
    if task == "speech-recognition":  # held-out clips (absolute paths), a blank line skipped
        path = tmp / "clips.txt"
        clips = [r["audio"] for r in map(json.loads, write_speech_jsonl(
            tmp / "held-out.jsonl", n=3, split="eval").read_text().splitlines())]  # fmt: skip
        path.write_text(f"{clips[0]}\n\n{clips[1]}\n{clips[2]}\n")
        return path
    rows = lambda name: [json.loads(x) for x in (DATA / name).read_text().splitlines()[:2]]  # noqa: E731
    lines = {
        "sequence-classification": ["great fun movie", '{"text": "terrible plot"}'],
        # (words of several sub-tokens, each tagged by its first: Bergenholm, Kiramensah)
        "token-classification": ["Kiramensah Mensah flew to Bergenholm and Redstoneclinic ."]
        + [json.dumps({"tokens": r["tokens"]}) for r in rows("ner-eval.jsonl")],
        "question-answering": [
            json.dumps({"question": r["question"], "context": r["context"]})
            for r in rows("qa-eval.jsonl")
        ],
        "masked-lm": ["The company is [MASK] in Hobart.", "Fay [MASK] Northwind [MASK] in 2000."],
        "causal-lm": ["the cat sat", "dogs ran in"],
        "instruction": ["Is 3 larger than 2?", "Add 17 and 10."],
        "seq2seq": [r["source"] for r in rows("numbers-eval.jsonl")],
        "sentence-embedding": ["a cat sat on the mat", '{"text": "dogs ran in the park"}'],
    }[task]
    path = tmp / "inputs.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


class Matrix:
    """Trains each task once and runs each (op, runtime) once; tests read the results.

    ``shared``: ``root`` outlives the session (conftest's ``task_matrix`` under
    ORTFT_TEST_MATRIX_DIR), so a later session on the same code reuses a run an earlier one
    trained, and test processes of one session may ask for the same task at once: each task's
    training and predict inputs are written once, under a lock, and marked complete last."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.runs: dict[str, Path] = {}
        self.results: dict[tuple[str, str, str], Any] = {}

    def run(self, task: str) -> Path:
        if task not in self.runs:
            tmp = self.root / task
            with _locked(self.root / f"{task}.lock"):
                if not (tmp / TRAINED).exists():
                    shutil.rmtree(tmp, ignore_errors=True)  # a session stopped mid-training
                    tmp.mkdir()
                    recipe = write_recipe(tmp / "r.yaml", _recipe(task, tmp))
                    res = run_cli(
                        "train",
                        str(recipe),
                        "-o",
                        str(tmp / "run"),
                        timeout=600,
                        env={"NO_COLOR": "1"},
                    )
                    assert res.returncode == 0, res.stderr[-3000:]
                    (tmp / TRAINED).touch()
            self.runs[task] = tmp / "run"
        return self.runs[task]

    def inputs(self, task: str) -> Path:
        """The task's predict inputs (``_inputs``), beside its run; written once."""
        tmp = self.run(task).parent
        with _locked(self.root / f"{task}.lock"):
            marker = tmp / INPUTS
            if not marker.exists():
                marker.write_text(str(_inputs(task, tmp)))
            return Path(marker.read_text())

    def summary(self, task: str) -> dict[str, Any]:
        return summary(self.run(task))

    def int4(self, task: str = "causal-lm") -> Path:
        """``ortft export RUN -o RUN/onnx-int4 --quantize int4`` of the task's run, once (the
        int4 checks here and the consumer tier's clients of the int4 file share it)."""
        out = self.run(task) / "onnx-int4"
        with _locked(self.root / f"{task}.lock"):
            if not (out / "export.json").exists():
                args = ["export", str(self.run(task)), "-o", str(out), "--quantize", "int4"]
                res = CliRunner().invoke(app, args)
                assert res.exit_code == 0, res.stderr + str(res.exception)
        return out

    def result(self, task: str, op: str, runtime: str) -> Any:
        key = (task, op, runtime)
        if key not in self.results:
            run = self.run(task)
            source = run / "onnx" if runtime == "onnx" else run
            args = ["eval", str(source), "--json"]
            if op == "predict":
                inputs = self.inputs(task)
                args = ["predict", str(source), "-i", str(inputs), "--json"]
                args += ["--max-new-tokens", str(MAX_NEW)]
            res = CliRunner().invoke(app, args)
            assert res.exit_code == 0, res.stderr + str(res.exception)
            out = res.stdout
            self.results[key] = (
                json.loads(out) if op == "eval" else [json.loads(x) for x in out.splitlines()]
            )
        return self.results[key]


@pytest.fixture(scope="module")
def matrix(task_matrix: Matrix) -> Matrix:
    return task_matrix


# every task exports (none implements traits.SkipsExport), so every cell runs on ONNX too
CELLS = [
    pytest.param(t, op, rt, id=f"{t}-{op}-{rt}")
    for t in TASKS
    for op in ("eval", "predict")
    for rt in ("pytorch", "onnx")
]


# --------------------------------------------------------------------------- what a cell checks


def _check_eval(task: str, got: dict[str, Any], m: Matrix, runtime: str) -> None:
    spec = tasks.get(task)
    assert got["task"] == task and got["examples"] > 0
    assert got["runtime"] == {"pytorch": "pytorch", "onnx": "onnxruntime"}[runtime]
    names = {k.removeprefix("eval_") for k in spec.eval_metrics}
    assert names <= set(got["metrics"]), (names, got["metrics"])
    if runtime == "pytorch":  # the numbers training reported on the same split
        trained = m.summary(task)["metrics"]
        for k, v in got["metrics"].items():
            assert v == pytest.approx(trained[f"eval_{k}"], rel=1e-4, abs=1e-5), k
    else:  # the numbers PyTorch gives
        want = m.result(task, "eval", "pytorch")
        assert got["examples"] == want["examples"]
        for k, v in want["metrics"].items():
            assert got["metrics"][k] == pytest.approx(v, rel=1e-4, abs=1e-5), k


def _check_predict(task: str, got: list[dict[str, Any]], m: Matrix) -> None:
    inputs = [x for x in m.inputs(task).read_text().splitlines() if x]
    assert [r["index"] for r in got] == list(range(len(inputs)))
    kind = traits.predicts(tasks.get(task))
    config = json.loads((m.run(task) / "final" / "config.json").read_text())
    labels = set(config.get("id2label", {}).values())
    for line, r in zip(inputs, got, strict=True):
        obj = json.loads(line) if line.startswith("{") else {"text": line}
        if kind == "transcript":  # the file's transcript, its duration, not cut (< 3 s)
            assert r["input"] == line.strip() and isinstance(r["text"], str)
            assert r["seconds"] > 0 and r["cut"] is False
        elif kind == "image-label":  # the label, every label's score, the top 5 best first
            assert r["input"] == line.strip() and r["label"] in labels
            assert set(r["scores"]) == labels and sum(r["scores"].values()) == pytest.approx(1)
            assert r["top_k"][0] == [r["label"], r["score"]] and len(r["top_k"]) == 5
            assert [p for _, p in r["top_k"]] == sorted(r["scores"].values(), reverse=True)[:5]
        elif kind == "label":
            assert r["label"] in labels and set(r["scores"]) == labels
            assert sum(r["scores"].values()) == pytest.approx(1.0)
        elif kind == "tags":  # one tag per word
            words = obj.get("tokens") or obj["text"].split()
            assert r["tokens"] == words and len(r["tags"]) == len(words)
            assert set(r["tags"]) <= labels
        elif kind == "answer":  # a span of the context, its character offsets
            assert r["answer"] and obj["context"][r["start"] : r["end"]] == r["answer"]
            assert 0 < r["score"] <= 1
        elif kind == "embedding":  # one vector of the model's width per text
            assert len(r["embedding"]) == config["hidden_size"]
            assert all(isinstance(v, float) for v in r["embedding"])
        elif kind == "fill-mask":  # each [MASK] filled, with its candidates
            assert len(r["masks"]) == obj["text"].count("[MASK]")
            assert all(len(x["candidates"]) == 5 for x in r["masks"])
            assert "[MASK]" not in r["filled"] and r["filled"]
        else:
            assert kind == "generate"
            assert isinstance(r["generated"], str) and 0 <= r["new_tokens"] <= MAX_NEW
            if task == "seq2seq":  # trained to write digits (SEQ2SEQ_STEPS): never nothing
                assert r["generated"] and r["new_tokens"] > 0, r


def _same_predictions(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> None:
    """Equal outputs: texts, labels and offsets exactly, scores (floats) to 1e-4."""
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert _close(g, w), (g, w)


def _close(a: Any, b: Any) -> bool:
    if isinstance(b, float):
        return a == pytest.approx(b, abs=1e-4)
    if isinstance(b, dict):
        return set(a) == set(b) and all(_close(a[k], b[k]) for k in b)
    if isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    return a == b


@pytest.mark.parametrize(("task", "op", "runtime"), CELLS)
def test_task_matrix(task: str, op: str, runtime: str, matrix: Matrix) -> None:
    got = matrix.result(task, op, runtime)
    if op == "eval":
        _check_eval(task, got, matrix, runtime)
        return
    _check_predict(task, got, matrix)
    if runtime == "onnx" and task == "image-classification":
        _client_predictions(got, matrix)
        _near_predictions(got, matrix.result(task, "predict", "pytorch"), IMAGE_ONNX_TOLERANCE)
    elif runtime == "onnx":
        _same_predictions(got, matrix.result(task, "predict", "pytorch"))


def _client_predictions(got: list[dict[str, Any]], m: Matrix) -> None:
    """An image export's predictions are what a client gets running its two graphs by hand:
    each decoded image through preprocess.onnx, then model.onnx, softmax."""
    import numpy as np
    import onnxruntime as ort

    from ortft.data import images

    run = m.run("image-classification")
    pre, model = (
        ort.InferenceSession(str(run / "onnx" / f)) for f in ("preprocess.onnx", "model.onnx")
    )
    labels = json.loads((run / "onnx" / "config.json").read_text())["id2label"]
    for r in got:
        x = pre.run(None, {"image": images.pixels(str(run.parent / r["input"]))})[0]
        z = model.run(None, {"pixel_values": x})[0][0].astype(np.float64)
        p = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
        want = {labels[str(i)]: float(v) for i, v in enumerate(p)}
        assert r["scores"] == pytest.approx(want, abs=1e-6), r["input"]


def _near_predictions(got: list[dict[str, Any]], want: list[dict[str, Any]], tol: float) -> None:
    """Scores within ``tol``; the same label unless PyTorch's best two are within 2 * tol."""
    assert [g["input"] for g in got] == [w["input"] for w in want]
    for g, w in zip(got, want, strict=True):
        assert all(abs(g["scores"][k] - v) <= tol for k, v in w["scores"].items()), (g, w)
        (_, p1), (_, p2) = w["top_k"][:2]
        assert g["label"] == w["label"] or p1 - p2 <= 2 * tol, (g, w)


def _as_format_2(folder: Path, out: Path, output: str = "logits") -> Path:
    """A copy of a question-answering export as ortft wrote it before format 3: one output
    ``output``, start and end logits stacked [batch, 2, sequence]."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    shutil.rmtree(out, ignore_errors=True)  # a shared matrix's earlier session left one
    shutil.copytree(folder, out, symlinks=True)
    model = onnx.load(str(out / "model.onnx"))
    g = model.graph
    g.initializer.append(numpy_helper.from_array(np.array([1], np.int64), "stack_axis"))
    g.node.extend(
        [
            helper.make_node("Unsqueeze", ["start_logits", "stack_axis"], ["start_1"]),
            helper.make_node("Unsqueeze", ["end_logits", "stack_axis"], ["end_1"]),
            helper.make_node("Concat", ["start_1", "end_1"], [output], axis=1),
        ]
    )
    del g.output[:]
    g.output.append(helper.make_tensor_value_info(output, TensorProto.FLOAT, ["batch", 2, "seq"]))
    onnx.save(model, str(out / "model.onnx"))
    report = json.loads((out / "export.json").read_text())
    report.update(format_version=2, outputs=[output])
    (out / "export.json").write_text(json.dumps(report))
    return out


def test_question_answering_export_of_format_2_still_reads(matrix: Matrix) -> None:
    """An export written before the split outputs (format 2: one stacked ``logits``) gives the
    same answers, scores and eval metrics as today's; a graph with neither is refused in one
    line that says to re-export."""
    run = matrix.run("question-answering")
    assert json.loads((run / "onnx" / "export.json").read_text())["outputs"] == [
        "start_logits",
        "end_logits",
    ]
    inputs = matrix.inputs("question-answering")
    want = matrix.result("question-answering", "predict", "onnx")
    # in the run, and outside it: padded to the tokenizer's 512, not the run's 64 (the score
    # leaves padding out, so it is the same)
    for old in (run / "onnx-format-2", run.parent / "onnx-format-2"):
        _as_format_2(run / "onnx", old)
        args = ["predict", str(old), "-i", str(inputs), "--json"]
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 0, res.stderr + str(res.exception)
        _same_predictions([json.loads(x) for x in res.stdout.splitlines()], want)
    res = CliRunner().invoke(app, ["eval", str(run / "onnx-format-2"), "--json"])
    assert res.exit_code == 0, res.stderr + str(res.exception)
    metrics = matrix.result("question-answering", "eval", "onnx")["metrics"]
    assert json.loads(res.stdout)["metrics"] == pytest.approx(metrics, rel=1e-5)
    other = _as_format_2(run / "onnx", run / "onnx-other", output="scores")
    res = CliRunner().invoke(app, ["predict", str(other), "-i", str(inputs)])
    assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert res.stderr.startswith("error: ")
    assert "gives scores, not start_logits, end_logits" in res.stderr
    assert "re-export it with `ortft export RUN`" in res.stderr


def test_int4_export_of_a_decoder(matrix: Matrix) -> None:
    """The task matrix's causal-lm (a Llama) exported with --quantize int4: MatMulNBits in place
    of every MatMul of a weight, export.json's int4 section with its settings, quality and size
    (GPT-2's Gemm layers: tests/test_int4.py); the int4 file linked for transformers.js's
    ``dtype: "q4"`` and in onnxruntime-genai's ``int4/`` folder (their clients open them in
    tests/test_consumer_int4.py)."""
    from collections import Counter

    import numpy as np
    import onnx

    out = matrix.int4("causal-lm")
    report = json.loads((out / "export.json").read_text())
    _assert_int4_links(out, report)
    assert report["passed"] is True and report["files"]["int4"] == "model.int4.onnx"

    def weighted(path: Path) -> Counter[str]:  # nodes of each kind, and MatMuls of a weight
        graph = onnx.load(str(path)).graph
        weights = {t.name for t in graph.initializer}
        kinds = Counter(n.op_type for n in graph.node)
        kinds["of a weight"] = sum(
            n.op_type in ("MatMul", "Gemm") and n.input[1] in weights for n in graph.node
        )
        return kinds

    fp32, ops = weighted(out / "model.onnx"), weighted(out / "model.int4.onnx")
    assert ops["MatMulNBits"] == fp32["of a weight"] > 0 and ops["of a weight"] == 0
    q = report["int4"]
    assert (q["algorithm"], q["bits"], q["block_size"], q["symmetric"]) == ("RTN", 4, 32, False)
    assert sum(q["nodes_quantized"].values()) == fp32["of a weight"]
    assert q["bytes"] < report["bytes"] and q["size_ratio"] < 0.8
    greedy, ppl = q["quality"]["greedy"], q["quality"]["perplexity"]
    assert greedy["prompts"] > 0 and greedy["new_tokens"] >= greedy["prompts"]
    # recorded, not gated: the 2-step model's logits are near ties (0.36 of the tokens equal)
    assert 0 <= greedy["tokens_equal"] <= 1 and greedy["new_tokens"] <= 16 * greedy["prompts"]
    assert len(greedy["first_difference"]) == greedy["prompts"]
    assert greedy["first_difference"].count(None) == greedy["identical_prompts"]
    assert ppl["rows"] > 0 and ppl["fp32"] > 1
    assert ppl["int4"] != ppl["fp32"] and abs(ppl["relative_change"]) < 0.05
    assert np.isclose(ppl["int4"] / ppl["fp32"] - 1, ppl["relative_change"], atol=1e-3)
    assert report["latency"]["ms"].keys() == {"fp32", "int4"}


def _assert_int4_links(out: Path, report: dict[str, Any]) -> None:
    """transformers.js's q4 name, and genai's int4/ folder: a genai_config.json naming the int4
    file, which is the fp32 one's but for the file, and links to the root's int4 and tokenizer
    files, all in export.json's links and named by the card."""
    from ortft.families.generation import genai

    int4 = {"folder": "int4", "config": "int4/genai_config.json", "filename": "model.int4.onnx"}
    assert report["genai"] == {"config": genai.FILE, "model_type": "llama", "int4": int4}
    links = {f"int4/{f}": f for f in ("model.int4.onnx", "tokenizer.json", "tokenizer_config.json")}
    assert report["links"] == {
        **links, "onnx/model.onnx": "model.onnx", "onnx/model_q4.onnx": "model.int4.onnx"
    }  # fmt: skip
    for link, target in report["links"].items():
        assert (out / link).is_symlink() and (out / link).resolve() == (out / target).resolve()
    assert sorted(p.name for p in (out / "int4").iterdir()) == sorted(
        [genai.FILE, *(Path(x).name for x in links)]
    )
    fp32, q4 = (json.loads((out / f).read_text()) for f in (genai.FILE, int4["config"]))
    assert q4["model"]["decoder"].pop("filename") == "model.int4.onnx"
    assert fp32["model"]["decoder"].pop("filename") == "model.onnx" and q4 == fp32
    card = (out / "README.md").read_text()
    assert '`og.Model("int4")` opens the int4 weights (`model.int4.onnx`' in card
    assert '{ dtype: "q4" }' in card


def test_int4_is_refused_for_a_model_that_does_not_generate(matrix: Matrix, tmp_path: Path) -> None:
    res = CliRunner().invoke(
        app,
        ["export", str(matrix.run("sequence-classification")), "-o", str(tmp_path / "x"),
         "--quantize", "int4"],
    )  # fmt: skip
    assert res.exit_code == 2
    assert res.stderr.strip().splitlines() == [
        "error: --quantize int4 is weight-only int4 for decoders (causal-lm, instruction), not "
        "sequence-classification: use --quantize int8"
    ]
    assert not (tmp_path / "x").exists()
