"""Generation configs honoured on ONNX as ``generate`` honours them (``ortft.export.generation``).

Tiny models built here (2 layers, hidden 32) with a generation config that sets the options a
BART, a T5 or a GPT-2 checkpoint may set: the ported search against ``model.generate`` on
PyTorch, the export's generation check, ``ortft predict`` on ONNX against PyTorch, and the
gate a failed generation check is in a run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

TEXTS = [
    "the cat sat on the mat and looked at the dog",
    "a dog ran in the park with a red ball",
    "birds sing in the morning when the sun comes up",
    "she read a book about the sea and the ships",
    "we walked to the market to buy fresh bread",
    "the rain fell on the roof all night long",
] * 4
INPUTS = ["the cat sat on", "a dog ran in the park", "birds sing"]
NEW_TOKENS = 8

# generation configs as BART, T5 and GPT-2 checkpoints set them (ids filled in by ``_build``)
BART = dict(
    num_beams=2, no_repeat_ngram_size=2, min_length=5, repetition_penalty=1.3,
    length_penalty=2.0, early_stopping=True,
)  # fmt: skip
T5 = dict(
    num_beams=3, no_repeat_ngram_size=2, min_new_tokens=3, repetition_penalty=1.2,
    length_penalty=0.8, early_stopping="never",
)  # fmt: skip
GPT2 = dict(repetition_penalty=1.4, no_repeat_ngram_size=2)


def _tokenizer(kind: str) -> Any:
    from ortft.backends.torch.models import train_tokenizer
    from ortft.recipe.schema import TrainTokenizer

    return train_tokenizer(TEXTS, TrainTokenizer(kind=kind, vocab_size=300, min_frequency=1))


def _build(kind: str, **gen: Any) -> tuple[Any, Any]:
    """(model, tokenizer): a tiny ``kind`` (bart, t5, gpt2) with ``gen`` in its generation config."""
    from transformers import (
        BartConfig,
        BartForConditionalGeneration,
        GPT2Config,
        GPT2LMHeadModel,
        T5Config,
        T5ForConditionalGeneration,
    )

    torch.manual_seed(0)
    if kind == "gpt2":
        tok = _tokenizer("byte-bpe")
        eos = tok.eos_token_id
        model = GPT2LMHeadModel(GPT2Config(
            vocab_size=len(tok), n_embd=32, n_layer=2, n_head=2, n_positions=64,
            bos_token_id=eos, eos_token_id=eos, pad_token_id=eos,
        ))  # fmt: skip
    else:
        tok = _tokenizer("wordpiece")
        pad, cls, sep = tok.pad_token_id, tok.cls_token_id, tok.sep_token_id
        if kind == "bart":
            gen = {"forced_bos_token_id": cls, "forced_eos_token_id": sep, **gen}
            model = BartForConditionalGeneration(BartConfig(
                vocab_size=len(tok), d_model=32, encoder_layers=2, decoder_layers=2,
                encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
                decoder_ffn_dim=64, max_position_embeddings=64, pad_token_id=pad,
                bos_token_id=cls, eos_token_id=sep, decoder_start_token_id=sep,
            ))  # fmt: skip
        else:
            gen = {"suppress_tokens": [tok.unk_token_id], **gen}
            model = T5ForConditionalGeneration(T5Config(
                vocab_size=len(tok), d_model=32, d_kv=16, d_ff=64, num_layers=2,
                num_decoder_layers=2, num_heads=2, pad_token_id=pad, eos_token_id=sep,
                decoder_start_token_id=pad,
            ))  # fmt: skip
    for key, value in gen.items():
        setattr(model.generation_config, key, value)
    return model.eval(), tok


def _favourite(model: Any, tok: Any) -> int:
    """The token a tiny random model generates most from ``INPUTS``: made an eos, it ends
    hypotheses at different lengths, so that length_penalty and early_stopping matter."""
    counts: dict[int, int] = {}
    for text in INPUTS:
        x = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
        with torch.no_grad():
            out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=NEW_TOKENS)
        for t in out[0, x.shape[1] :].tolist():
            counts[t] = counts.get(t, 0) + 1
    return max(counts, key=lambda t: (counts[t], -t))


def _save(model: Any, tok: Any, folder: Path, task: str) -> Path:
    """A saved model folder ``ortft predict`` opens as ``task`` (export.json names it)."""
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    (folder / "export.json").write_text(json.dumps({"task": task}))
    return folder


def _export(model: Any, tok: Any, task: str, out: Path, **options: Any) -> dict[str, Any]:
    from ortft.export.exporter import ExportOptions, export_model

    opts = ExportOptions(**options)
    return export_model(model, tok, task, out, opset=20, tolerance=1e-4, options=opts)


def _predict(source: Path, tmp_path: Path) -> list[str]:
    from ortft.inference import predict

    inputs = tmp_path / "inputs.txt"
    inputs.write_text("\n".join(INPUTS) + "\n")
    results = predict.run(source, str(inputs), max_new_tokens=NEW_TOKENS)
    return [r["generated"] for r in results]


# --------------------------------------------------------------------------- the search itself


class _TorchSteps:
    """``generation.Steps`` over the PyTorch model, the whole sequence each call (no cache)."""

    def __init__(self, model: Any):
        from ortft.families.generation.decoder_graph import WholeSteps

        def logits(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
            with torch.no_grad():
                out = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask))
            return out.logits.numpy()

        self.inner = WholeSteps(logits)

    def __call__(self, tokens: np.ndarray) -> np.ndarray:
        return self.inner(tokens)

    def reorder(self, rows: np.ndarray) -> None:
        self.inner.reorder(rows)


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"num_beams": 2},
        {"num_beams": 3, "length_penalty": 0.5, "early_stopping": True, "no_repeat_ngram_size": 2},
        {"num_beams": 2, "early_stopping": "never", "min_new_tokens": 5, "repetition_penalty": 1.2},
        {"num_beams": 4, "suppress_tokens": [1, 2], "begin_suppress_tokens": [3], "min_length": 9},
        {"forced_bos_token_id": 5, "forced_eos_token_id": 7, "max_new_tokens": 6, **GPT2},
        # an eos the model likes: hypotheses end at different lengths
        {"num_beams": 3, "length_penalty": 0.5, "eos": True},
        {"num_beams": 3, "length_penalty": 2.0, "eos": True},
        {"num_beams": 3, "length_penalty": 2.0, "early_stopping": True, "eos": True},
        {"num_beams": 2, "length_penalty": 1.5, "early_stopping": "never", "eos": True},
        {"eos": True, "min_new_tokens": 4, **GPT2},
    ],
)
def test_search_matches_generate(options: dict[str, Any]) -> None:
    """The port of ``_sample`` / ``_beam_search`` picks generate's tokens, step for step."""
    from ortft.export import generation

    model, tok = _build("gpt2")
    options = dict(options)
    if options.pop("eos", False):  # two eos ids: the tokenizer's and the favourite
        options["eos_token_id"] = [tok.eos_token_id, _favourite(model, tok)]
    gc = generation.deterministic(model.generation_config, **{"max_new_tokens": 10, **options})
    for seed in range(3):
        prompt = np.random.default_rng(seed).integers(1, 200, (1, 5))
        x = torch.from_numpy(prompt)
        with torch.no_grad():
            want = model.generate(x, attention_mask=torch.ones_like(x), generation_config=gc)
        p = generation.plan(gc, 5, encoder_decoder=False, max_positions=64)
        got, _ = generation.generate(_TorchSteps(model), prompt, p)
        assert got.tolist() == want.tolist(), (options, seed)


def test_unsupported_option_is_refused(tmp_path: Path) -> None:
    from ortft.core.errors import InputError

    model, tok = _build("gpt2", **GPT2)
    out = tmp_path / "onnx"
    assert _export(model, tok, "causal-lm", out)["passed"]
    gc = json.loads((out / "generation_config.json").read_text())
    (out / "generation_config.json").write_text(json.dumps({**gc, "max_time": 5.0}))
    with pytest.raises(InputError, match="max_time"):
        _predict(out, tmp_path)


# --------------------------------------------------------------------------- ONNX = PyTorch


@pytest.mark.parametrize("kind", ["bart", "t5"])
def test_seq2seq_onnx_predict_equals_pytorch(kind: str, tmp_path: Path) -> None:
    model, tok = _build(kind, **(BART if kind == "bart" else T5))
    out = tmp_path / "onnx"
    report = _export(model, tok, "seq2seq", out)
    gen = report["generation"]
    assert report["passed"], report["failures"]
    assert gen["passed"] and gen["num_beams"] == model.generation_config.num_beams
    assert (out / "generation_config.json").exists()
    want = _predict(_save(model, tok, tmp_path / "model", "seq2seq"), tmp_path)
    assert _predict(out, tmp_path) == want
    # and greedy (num_beams 1) with the same processors (a saved config may not keep beam options)
    gc = model.generation_config
    gc.num_beams, gc.length_penalty, gc.early_stopping = 1, 1.0, False
    report = _export(model, tok, "seq2seq", tmp_path / "onnx1")
    assert report["passed"] and report["generation"]["num_beams"] == 1, report["failures"]
    want = _predict(_save(model, tok, tmp_path / "model1", "seq2seq"), tmp_path)
    assert _predict(tmp_path / "onnx1", tmp_path) == want
    # an older export's names (format_version 2, no cross cache): refused, naming the re-export
    from ortft.core.errors import InputError

    (out / "encoder_model.onnx").rename(out / "encoder.onnx")
    (out / "decoder_model_merged.onnx").rename(out / "decoder.onnx")
    with pytest.raises(InputError, match="re-export it with `ortft export RUN`"):
        _predict(out, tmp_path)


@pytest.mark.parametrize("beams", [1, 2])
def test_decoder_onnx_predict_equals_pytorch(beams: int, tmp_path: Path) -> None:
    model, tok = _build("gpt2", num_beams=beams, **GPT2)
    if beams > 1:  # hypotheses that end at different lengths: the length penalty counts
        gc = model.generation_config
        gc.eos_token_id = [tok.eos_token_id, _favourite(model, tok)]
        gc.length_penalty, gc.early_stopping = 2.0, True
    report = _export(model, tok, "causal-lm", tmp_path / "onnx")
    assert report["passed"] and report["generation"]["passed"], report["failures"]
    assert report["generation"]["num_beams"] == beams
    _export(model, tok, "causal-lm", tmp_path / "nocache", kv_cache=False)
    want = _predict(_save(model, tok, tmp_path / "model", "causal-lm"), tmp_path)
    assert _predict(tmp_path / "onnx", tmp_path) == want
    assert _predict(tmp_path / "nocache", tmp_path) == want


# --------------------------------------------------------------------------- the gate in a run

# the run's export with a generation check that diverges (as the ONNX loop without the model's
# logits processors did): one mismatch more than the real comparison found
_FAILING_GENERATION = (
    "import sys; sys.argv = ['ortft', *sys.argv[1:]]\n"
    "import ortft.export.decoder as d\n"
    "real = d.compare\n"
    "def compare(*a, **k):\n"
    "    c, m, t, diff = real(*a, **k)\n"
    "    return c, m + 1, t, diff\n"
    "d.compare = compare\n"
    "from ortft.cli.app import main\n"
    "main()\n"
)


@pytest.mark.parametrize("required", [True, False])
def test_failed_generation_check_is_a_gate(required: bool, tmp_path: Path) -> None:
    from conftest import tiny_causal_lm, write_corpus, write_recipe
    from helpers import run_cli

    write_corpus(tmp_path / "train.txt")
    recipe = tiny_causal_lm("train.txt", backend="torch", max_steps=2)
    recipe["export"] = {"required": required}
    run = tmp_path / "run"
    res = run_cli(
        "train", write_recipe(tmp_path / "r.yaml", recipe), "--output-dir", run,
        code=_FAILING_GENERATION, env={"NO_COLOR": "1"},
    )  # fmt: skip
    assert (run / "onnx.failed" / "export.json").exists() and not (run / "onnx").exists()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["export"]["generation"]["passed"] is False
    gates = {g["metric"]: g["passed"] for g in summary["gates"]}
    if required:
        assert res.returncode == 3, res.stderr[-2000:]
        assert "gate FAIL  export.generation.passed" in res.stderr
        assert gates == {"export.max_abs_diff": True, "export.generation.passed": False}
    else:
        assert res.returncode == 0, res.stderr[-2000:]
        assert "export.required: false" in res.stderr and gates == {}
