"""genai_config.json (``ortft.families.generation.genai``): what ortft writes for
onnxruntime-genai, read off a graph's cache inputs, and when it writes none. genai running an
export is the consumer tier's (tests/test_consumer_genai.py)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import onnx
import pytest
from onnx import TensorProto, helper

from ortft.families.generation import genai


def _graph(folder: Path, layers: int, kv_heads: int, head: int) -> None:
    """A stand-in model.onnx with a decoder's names: past in, present out (Identity)."""
    shape = ["batch", kv_heads, "past_sequence", head]
    past = [f"past_key_values.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in past]
    present = [n.replace("past_key_values", "present") for n in past]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in present]
    nodes = [helper.make_node("Identity", [a], [b]) for a, b in zip(past, present, strict=True)]
    onnx.save(helper.make_model(helper.make_graph(nodes, "g", inputs, outputs)), folder / "m.onnx")


def _config(model_type: str, **extra: object) -> SimpleNamespace:
    sizes = {"hidden_size": 64, "num_attention_heads": 4, "vocab_size": 300}
    return SimpleNamespace(model_type=model_type, max_position_embeddings=128, **sizes, **extra)


def test_writes_the_cache_layout_of_the_graph(tmp_path: Path) -> None:
    _graph(tmp_path, layers=3, kv_heads=2, head=16)  # grouped-query: 2 key/value heads of 4
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [5, 7]}))
    report = {"kv_cache": True, "files": {"model": "m.onnx"}}
    config = _config("qwen2", bos_token_id=1, eos_token_id=2, pad_token_id=None)
    assert genai.write(tmp_path, config, report) == {"config": genai.FILE, "model_type": "qwen2"}
    body = json.loads((tmp_path / genai.FILE).read_text())
    model, dec = body["model"], body["model"]["decoder"]
    assert (model["type"], model["context_length"], model["vocab_size"]) == ("qwen2", 128, 300)
    assert (model["bos_token_id"], model["eos_token_id"]) == (1, [5, 7])  # generation config's
    assert "pad_token_id" not in model  # none: left out, not null
    assert (dec["num_hidden_layers"], dec["num_key_value_heads"], dec["head_size"]) == (3, 2, 16)
    assert (dec["num_attention_heads"], dec["hidden_size"]) == (4, 64)
    assert dec["inputs"]["past_key_names"] == "past_key_values.%d.key"
    assert dec["outputs"]["present_value_names"] == "present.%d.value"
    assert "position_ids" not in dec["inputs"]  # the graph takes none; genai then feeds none
    assert body["search"]["past_present_share_buffer"] is False  # the graph concatenates
    assert body["search"]["do_sample"] is False and body["search"]["max_length"] == 128


def test_writes_none_for_other_models_or_without_the_cache(tmp_path: Path) -> None:
    _graph(tmp_path, layers=1, kv_heads=1, head=8)
    cached = {"kv_cache": True, "files": {"model": "m.onnx"}}
    out = genai.write(tmp_path, _config("gpt2"), cached)
    assert "model_type gpt2" in out["skipped"] and "llama" in out["skipped"]
    out = genai.write(tmp_path, _config("llama"), {**cached, "kv_cache": False})
    assert "no KV cache" in out["skipped"]
    assert not (tmp_path / genai.FILE).exists()


def test_int4_gets_its_own_folder_of_links(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With model.int4.onnx, ``int4/`` holds a config naming it and links to the root's int4
    and tokenizer files (in export.json's links); where the file system makes no links, no
    folder, and ``int4.skipped`` says why."""
    import os

    _graph(tmp_path, layers=1, kv_heads=1, head=8)
    (tmp_path / "m.onnx").rename(tmp_path / "model.onnx")
    _graph(tmp_path, layers=1, kv_heads=1, head=8)
    (tmp_path / "m.onnx").rename(tmp_path / "model.int4.onnx")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_text("{}")
    files = {"model": "model.onnx", "int4": "model.int4.onnx"}
    report: dict = {"kv_cache": True, "files": files, "links": {"onnx/model.onnx": "model.onnx"}}
    out = genai.write(tmp_path, _config("llama"), report)
    assert out["int4"] == {
        "folder": "int4", "config": "int4/genai_config.json", "filename": "model.int4.onnx"
    }  # fmt: skip
    links = {f"int4/{f}": f for f in ("model.int4.onnx", "tokenizer.json", "tokenizer_config.json")}
    assert report["links"] == {"onnx/model.onnx": "model.onnx", **links}
    for link, target in links.items():
        assert os.readlink(tmp_path / link) == f"../{target}"
    body = json.loads((tmp_path / "int4" / genai.FILE).read_text())
    assert body["model"]["decoder"]["filename"] == "model.int4.onnx"

    def no_links(*args: object) -> None:
        raise OSError(1, "Operation not permitted")

    folder = tmp_path / "nolinks"
    folder.mkdir()
    for f in ("model.onnx", "model.int4.onnx", "tokenizer.json"):
        (folder / f).write_bytes((tmp_path / f).read_bytes())
    monkeypatch.setattr(os, "symlink", no_links)
    report = {"kv_cache": True, "files": files}
    out = genai.write(folder, _config("llama"), report)
    assert out["config"] == genai.FILE and "links" not in report
    assert out["int4"]["skipped"].startswith("no int4/ folder for onnxruntime-genai")
    assert not (folder / "int4").exists()
