"""genai_config.json (``ortft.families.generation.genai``): what ortft writes for
onnxruntime-genai, read off a graph's cache inputs, and when it writes none. genai running an
export is the consumer tier's (tests/test_consumer_genai.py)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import onnx
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
