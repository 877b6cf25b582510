"""``genai_config.json``: what onnxruntime-genai (0.18) reads to open a decoder export as written
(``og.Model(folder)``), beside model.onnx, config.json and the tokenizer files.

genai feeds the graph by the names the config gives: ``input_ids``, ``attention_mask`` and
``past_key_values.%d.key|value`` in, ``logits`` and ``present.%d.key|value`` out, which are the
names ortft's graph with its cache already has (``decoder_graph``). The past starts empty and
each step's present (past + new positions) is fed back as the next past, so
``past_present_share_buffer`` is off: ortft's graph concatenates, it does not write into a
buffer of the context length. The graph has no ``position_ids`` input, and genai feeds none
then: the graph counts positions from the past length, as for one prompt at a time (what the
consumer tier checks; docs/export.md).

Written for the model types whose decoder genai 0.18 runs on these inputs (``MODEL_TYPES``);
its tokenizer (onnxruntime-extensions) reads ortft's ``tokenizer.json``. The search defaults
are the model's generation config's (greedy unless it samples), its end the context length.

genai opens one decoder file per folder (``model.decoder.filename``, resolved in the config's
folder; 0.18 refuses a name with ``..``), so a ``--quantize int4`` export's ``model.int4.onnx``
gets a folder of its own, as genai's model builder writes one folder per precision: ``int4/``
holds a ``genai_config.json`` that names ``model.int4.onnx`` and relative links to the root's
int4 file (its external data too) and tokenizer files, which genai reads from the config's
folder. The root files stay the one copy (``ortft.export.layout``); export.json lists the links
under ``links``.
"""

from __future__ import annotations

import copy
import json
import logging
import shutil
from pathlib import Path
from typing import Any

from ortft.core.fsutil import write_json_atomic
from ortft.core.reports import ExportReport, Section

log = logging.getLogger("ortft")

FILE = "genai_config.json"
INT4_DIR = "int4"  # the int4 weights' folder (og.Model("int4"))
# what genai's tokenizer (onnxruntime-extensions) reads from the config's folder, where present
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
)
# transformers model_type -> genai's model type: decoders genai 0.18 runs as ortft writes them
MODEL_TYPES = {
    "llama": "llama",
    "mistral": "mistral",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "phi3": "phi3",
    "gemma": "gemma",
    "gemma2": "gemma2",
}
PAST_KEY, PAST_VALUE = "past_key_values.%d.key", "past_key_values.%d.value"
PRESENT_KEY, PRESENT_VALUE = "present.%d.key", "present.%d.value"


def write(folder: Path, config: Any, result: ExportReport) -> Section:
    """Writes ``genai_config.json`` into ``folder`` where genai can run the export; returns
    export.json's ``genai``: ``{"config", "model_type"}``, or ``{"skipped": why}``."""
    model_type = getattr(config, "model_type", None)
    if model_type not in MODEL_TYPES:
        supported = ", ".join(MODEL_TYPES)
        return {
            "skipped": f"model_type {model_type} is not a decoder onnxruntime-genai runs as "
            f"ortft exports it (genai_config.json is written for {supported})"
        }
    if not result.get("kv_cache"):
        return {
            "skipped": "the graph has no KV cache (--no-kv-cache, or an ONNX final/): "
            "onnxruntime-genai feeds past_key_values and reads present"
        }
    layers, kv_heads, head_size = _cache_dims(folder / result["files"]["model"])
    body = _config(folder, config, MODEL_TYPES[model_type], layers, kv_heads, head_size)
    write_json_atomic(folder / FILE, body)
    section: Section = {"config": FILE, "model_type": MODEL_TYPES[model_type]}
    if result["files"].get("int4"):
        section["int4"] = _int4_folder(folder, body, result)
    return section


def _int4_folder(folder: Path, body: dict[str, Any], result: ExportReport) -> Section:
    """``int4/`` (module doc): its genai_config.json and links, added to ``result``'s
    ``links``; returns the genai section's ``int4``: ``{"folder", "config", "filename"}``, or
    ``{"skipped": why}`` where the file system makes no links (a one-line warning)."""
    from ortft.export import layout

    name = result["files"]["int4"]
    targets = [name, *layout.external_files(folder / name)]
    targets += [f for f in TOKENIZER_FILES if (folder / f).is_file()]
    links = {f"{INT4_DIR}/{t}": t for t in targets}
    try:
        layout.make_links(folder, links)
    except OSError as err:
        shutil.rmtree(folder / INT4_DIR, ignore_errors=True)  # the links only
        why = f"no {INT4_DIR}/ folder for onnxruntime-genai: the file system makes no links ({err})"
        log.warning("%s: %s", folder, why)
        return {"skipped": why}
    int4 = copy.deepcopy(body)
    int4["model"]["decoder"]["filename"] = name
    write_json_atomic(folder / INT4_DIR / FILE, int4)
    result["links"] = {**result.get("links", {}), **links}
    return {"folder": INT4_DIR, "config": f"{INT4_DIR}/{FILE}", "filename": name}


def _cache_dims(graph: Path) -> tuple[int, int, int]:
    """(layers, key/value heads, head size), read from the graph's past inputs."""
    import onnx

    model = onnx.load(str(graph), load_external_data=False)
    past = [i for i in model.graph.input if i.name.startswith("past_key_values.")]
    dims = past[0].type.tensor_type.shape.dim
    return len(past) // 2, int(dims[1].dim_value), int(dims[3].dim_value)


def _tokens(gen: dict[str, Any], config: Any) -> dict[str, Any]:
    """bos, eos and pad ids: the generation config's, else the model config's; none: left out
    (genai then has no such token)."""
    names = ("bos_token_id", "eos_token_id", "pad_token_id")
    ids = {n: gen.get(n, getattr(config, n, None)) for n in names}
    return {n: v for n, v in ids.items() if v is not None}


def _config(
    folder: Path, config: Any, model_type: str, layers: int, kv_heads: int, head_size: int
) -> dict[str, Any]:
    """genai_config.json's body (the schema of genai 0.18's model builder, ``make_genai_config``,
    for a model without a shared past/present buffer)."""
    gen_path = folder / "generation_config.json"
    gen = json.loads(gen_path.read_text()) if gen_path.exists() else {}
    context = int(getattr(config, "max_position_embeddings", 0) or 2048)
    heads = int(config.num_attention_heads)
    decoder = {
        "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
        "filename": "model.onnx",
        "head_size": head_size,
        "hidden_size": int(config.hidden_size),
        "inputs": {
            "input_ids": "input_ids",
            "attention_mask": "attention_mask",
            "past_key_names": PAST_KEY,
            "past_value_names": PAST_VALUE,
        },
        "outputs": {
            "logits": "logits",
            "present_key_names": PRESENT_KEY,
            "present_value_names": PRESENT_VALUE,
        },
        "num_attention_heads": heads,
        "num_hidden_layers": layers,
        "num_key_value_heads": kv_heads,
    }
    search = {
        "diversity_penalty": float(gen.get("diversity_penalty", 0.0)),
        "do_sample": bool(gen.get("do_sample", False)),
        "early_stopping": True,
        "length_penalty": float(gen.get("length_penalty", 1.0)),
        "max_length": context,
        "min_length": 0,
        "no_repeat_ngram_size": int(gen.get("no_repeat_ngram_size", 0)),
        "num_beams": int(gen.get("num_beams", 1)),
        "num_return_sequences": int(gen.get("num_return_sequences", 1)),
        "past_present_share_buffer": False,  # the graph concatenates past and new positions
        "repetition_penalty": float(gen.get("repetition_penalty", 1.0)),
        "temperature": float(gen.get("temperature", 1.0)),
        "top_k": int(gen.get("top_k", 50)),
        "top_p": float(gen.get("top_p", 1.0)),
    }
    model = {
        **_tokens(gen, config),
        "context_length": context,
        "decoder": decoder,
        "type": model_type,
        "vocab_size": int(config.vocab_size),
    }
    return {"model": model, "search": search}
