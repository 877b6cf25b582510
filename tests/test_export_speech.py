"""The Whisper export (ortft.families.speech: graphs, runner): encoder_model.onnx,
decoder_model_merged.onnx with both caches and features.onnx, checked against PyTorch, and the ONNX runner generating token for
token as transformers' Whisper ``generate`` does.

The model is a tiny random Whisper (2+2 layers, d_model 64, 4 s windows) with a byte-BPE
tokenizer carrying Whisper's special tokens, built here. Random weights at the default scale
(init_std 0.02) give one token repeated on every clip; at 0.3 the clips get different tokens,
and ``_end_early`` makes end-of-text likely, so the checks see eos, padding and a first step
that begin_suppress_tokens decides.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from ortft.core.errors import InputError, RunError
from ortft.families.speech import graphs as speech
from ortft.families.speech import runner as speech_runner
from ortft.families.speech.runner import DECODER, ENCODER, OnnxWhisper

SPEECH = Path(__file__).resolve().parent.parent / "recipes" / "data" / "speech"
CLIPS, NEW_TOKENS = 6, 16


def _tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import WhisperTokenizer
    from transformers.models.whisper.tokenization_whisper import LANGUAGES

    texts = ["three one four", "one five nine two", "six five three five"] * 10
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )  # fmt: skip
    bpe.train_from_iterator(texts, trainer=trainer)
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m)
              for m in json.loads(bpe.to_str())["model"]["merges"]]  # fmt: skip
    tok = WhisperTokenizer(vocab=bpe.get_vocab(), merges=merges, language="en",
                           task="transcribe", predict_timestamps=False)  # fmt: skip
    specials = ["<|startoftranscript|>", *[f"<|{c}|>" for c in LANGUAGES], "<|translate|>",
                "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nocaptions|>",
                "<|notimestamps|>"]  # fmt: skip
    tok.add_special_tokens({"additional_special_tokens": specials})
    tok.set_prefix_tokens(language="en", task="transcribe", predict_timestamps=False)
    return tok


def _end_early(model, processor) -> None:
    """End-of-text scored 5% above the token the model starts the first eval clip with (its
    tied embedding and logit row: 1.05 x that token's). Measured on the 6 clips: without
    begin_suppress_tokens 4 transcripts are empty, with it 2 of 6 end before 16 tokens."""
    import soundfile as sf

    first = json.loads((SPEECH / "eval.jsonl").read_text().splitlines()[0])
    clip, rate = sf.read(SPEECH / first["audio"], dtype="float32")
    fe, tok = processor.feature_extractor, processor.tokenizer
    x = fe(clip, sampling_rate=rate, return_tensors="pt").input_features
    init = torch.tensor([tok.convert_tokens_to_ids(
        ["<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|notimestamps|>"])])  # fmt: skip
    weight = model.model.decoder.embed_tokens.weight
    with torch.no_grad():
        top = model(input_features=x, decoder_input_ids=init).logits[0, -1].argmax()
        weight[tok.eos_token_id] = 1.05 * weight[top]


@pytest.fixture(scope="module")
def whisper():
    """(model, processor, task): a tiny random Whisper and the speech task bound to it."""
    from transformers import WhisperConfig, WhisperFeatureExtractor, WhisperProcessor
    from transformers import WhisperForConditionalGeneration as Whisper

    from ortft.families import speech as sr
    from ortft.families.speech.task import generation_config

    tok, fe = _tokenizer(), WhisperFeatureExtractor(feature_size=80, chunk_length=4)
    eos = tok.eos_token_id
    config = WhisperConfig(
        vocab_size=len(tok), d_model=64, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=256,
        decoder_ffn_dim=256, num_mel_bins=80, max_source_positions=fe.nb_max_frames // 2,
        max_target_positions=64, pad_token_id=eos, bos_token_id=eos, eos_token_id=eos,
        decoder_start_token_id=tok.convert_tokens_to_ids("<|startoftranscript|>"),
        begin_suppress_tokens=None, suppress_tokens=None, init_std=0.3,
    )  # fmt: skip
    torch.manual_seed(0)
    model = Whisper(config).eval()
    model.generation_config = generation_config(tok, config, "en")
    processor = WhisperProcessor(feature_extractor=fe, tokenizer=tok)
    _end_early(model, processor)
    task = sr.build(sr.Options(max_target_length=32))
    task.bind(processor)
    return model, processor, task


@pytest.fixture(scope="module")
def exported(whisper, tmp_path_factory):
    """(folder, export.json's sections, the SpeechGraphs job) for the first committed eval clips."""
    model, processor, task = whisper
    lines = (SPEECH / "eval.jsonl").read_text().splitlines()[:CLIPS]
    rows = [{**r, "audio": str(SPEECH / r["audio"])} for r in map(json.loads, lines)]
    data = SimpleNamespace(audio_column="audio", text_column="text", on_bad_file="error")
    encoded = task.encode(rows, processor, data, None)
    job = speech.SpeechGraphs(model, processor, task, opset=20, tolerance=1e-4,
                              samples=encoded, n=CLIPS)  # fmt: skip
    folder = tmp_path_factory.mktemp("speech")
    return folder, job.build(folder), job


def test_export_checks_pass(exported):
    folder, report, _ = exported
    for name in (ENCODER, DECODER, "features.onnx", "generation_config.json"):
        assert (folder / name).is_file(), name
    assert report["files"] == {"encoder": ENCODER, "decoder": DECODER, "features": "features.onnx"}
    inputs = report["inputs"]["decoder"]
    assert inputs[:2] == ["input_ids", "encoder_hidden_states"]
    assert inputs[2:6] == [f"past_key_values.0.{s}.{kv}" for s in ("decoder", "encoder")
                           for kv in ("key", "value")] and inputs[-1] == "use_cache_branch"  # fmt: skip
    assert report["outputs"]["decoder"][1] == "present.0.decoder.key"
    p, g, f = report["parity"], report["generation"], report["features"]
    assert p["passed"] and p["source"] == "eval data" and p["samples"] == CLIPS, p
    assert g["passed"] and g["steps_compared"] > 0 and g["mismatches"] == 0, g
    assert g["outputs_equal"], g
    assert f["passed"] and f["max_abs_diff"] <= f["tolerance"], f
    assert report["end_to_end"]["transcripts_equal"] == report["end_to_end"]["clips"]


def test_merged_decoder_reads_the_cross_cache(exported, whisper):
    """The later steps read the cross-attention's keys and values from the past: fed a changed
    ``encoder_hidden_states`` they give the same logits, fed a changed past they do not, and
    give them back empty; the merged file holds one copy of the weights."""
    import onnx

    from ortft.export import cross_cache

    folder, _, job = exported
    model = whisper[0]
    pair = OnnxWhisper(folder, model.config)
    hidden = pair.encode(job.feeds["input_features"][:2])
    start = np.full((2, 4), model.config.decoder_start_token_id, dtype=np.int64)
    past = cross_cache.Past(pair.decoder, 2)
    pair._decode(start, hidden, past)
    token = np.ones((2, 1), dtype=np.int64)
    kept = {k: v.copy() for k, v in past.past.items()}
    want = pair._decode(token, hidden, past)
    past.past = dict(kept)
    assert np.array_equal(pair._decode(token, hidden * 0 + 1, past), want)
    past.past = {k: v * 0.5 if ".encoder." in k else v for k, v in kept.items()}
    assert not np.allclose(pair._decode(token, hidden, past), want, atol=1e-3)
    # the later steps' cross-attention presents are empty (Optimum's layout), not a copy
    feeds = {"input_ids": token, "encoder_hidden_states": hidden, **past.feeds()}
    names = [o.name for o in pair.decoder.get_outputs()]
    out = dict(zip(names, pair.decoder.run(None, feeds), strict=True))
    assert all(out[n].size == 0 for n in names if ".encoder." in n), names
    assert all(out[n].size > 0 for n in names if ".encoder." not in n), names
    graph = onnx.load(str(folder / DECODER), load_external_data=False).graph
    assert [n.op_type for n in graph.node] == ["If"]
    weight = model.model.decoder.layers[0].fc1.weight.detach().numpy()
    copies = [t for t in graph.initializer if t.dims == list(weight.shape)
              or t.dims == list(weight.shape[::-1])]  # fmt: skip
    assert len(copies) == len(model.model.decoder.layers) * 2  # fc1 and fc2 of each layer, once


def _gc(model, **fields):
    gc = copy.deepcopy(model.generation_config)
    for key, value in fields.items():
        setattr(gc, key, value)
    return gc


@pytest.mark.parametrize(
    "fields", [{}, {"language": None}, {"num_beams": 2}], ids=["saved", "detect", "beams"]
)
def test_generate_equals_pytorch(exported, whisper, fields, monkeypatch):
    """Token for token on 3 clips; ``language: None`` detects the language (one decoder step)."""
    folder, _, job = exported
    model = whisper[0]
    monkeypatch.setattr(model, "generation_config", _gc(model, **fields))
    pair = OnnxWhisper(folder, model.config)
    pair.generation_config = model.generation_config
    feats = job.feeds["input_features"][:3]
    with torch.no_grad():
        want = model.generate(torch.from_numpy(feats), max_new_tokens=NEW_TOKENS).numpy()
    got = pair.generate(feats, NEW_TOKENS)
    assert want.shape[1] > 2 and len({tuple(r) for r in want}) > 1  # the check says something
    np.testing.assert_array_equal(got, want)
    if not fields:  # a clip that ends early, alone: generate's output stops at its eos
        short = feats[want[:, -1] == model.generation_config.pad_token_id][:1]
        with torch.no_grad():
            want = model.generate(torch.from_numpy(short), max_new_tokens=NEW_TOKENS).numpy()
        assert 0 < want.shape[1] < NEW_TOKENS
        np.testing.assert_array_equal(pair.generate(short, NEW_TOKENS), want)


def test_transcribe_raw_clips(exported, whisper):
    """Raw clips through features.onnx, encoder and decoder: PyTorch's transcripts."""
    folder, _, job = exported
    model, processor, _ = whisper
    fe, tok = processor.feature_extractor, processor.tokenizer
    clips = job.decoded[:3]
    got = OnnxWhisper(folder, model.config).transcribe(clips, NEW_TOKENS)
    feats = fe(clips, sampling_rate=fe.sampling_rate, return_tensors="pt").input_features
    with torch.no_grad():
        want = model.generate(feats, max_new_tokens=NEW_TOKENS)
    assert tok.batch_decode(got, skip_special_tokens=True) == tok.batch_decode(
        want, skip_special_tokens=True
    )


def test_init_tokens(whisper):
    model, processor, _ = whisper
    ids = processor.tokenizer.convert_tokens_to_ids
    want = ids(["<|startoftranscript|>", "<|de|>", "<|transcribe|>", "<|notimestamps|>"])
    gc = _gc(model, language="german")
    got = speech_runner.init_tokens(gc, model.config, 2, detect=None)
    assert got.tolist() == [want, want]


def test_timestamp_pairs_refused(whisper):
    """Two timestamps in a row (not the row's single last token): generate would seek and
    decode again; the runner raises instead of returning other tokens."""
    gc = whisper[0].generation_config
    ts = gc.no_timestamps_token_id + 1  # timestamp tokens follow <|notimestamps|>
    speech_runner._check_segments([np.array([5, ts, ts, 6, ts])], gc)  # ends on one: kept
    with pytest.raises(RunError, match="two timestamp tokens"):
        speech_runner._check_segments([np.array([5, ts, ts, 6])], gc)


def test_refuses_timestamps(exported, whisper, monkeypatch):
    folder, _, job = exported
    model, processor, task = whisper
    pair = OnnxWhisper(folder, model.config)
    pair.generation_config = _gc(model, return_timestamps=True)
    with pytest.raises(InputError, match="return_timestamps"):
        pair.generate(job.feeds["input_features"][:1], 4)
    monkeypatch.setattr(model, "generation_config", pair.generation_config)
    with pytest.raises(InputError, match="return_timestamps"):
        speech.SpeechGraphs(model, processor, task, opset=20, tolerance=1e-4, samples=None, n=2)


def test_synthetic_clips(whisper):
    model, processor, task = whisper
    feeds, decoded, source = speech.clips(task, processor, None, 3, model.config.vocab_size)
    assert source == "synthetic" and len(decoded) == 3
    assert feeds["input_features"].shape == (3, 80, 400)
    assert feeds["labels"].shape == (3, speech.SYNTHETIC_LABELS)


def test_older_export_is_refused_naming_the_re_export(exported, tmp_path):
    """An export of format_version 2 (encoder.onnx + decoder.onnx, no cross cache): ortft
    predict stops in one line that names ``ortft export RUN``, exit 2."""
    import shutil

    from typer.testing import CliRunner

    from ortft.cli.app import app

    folder, _, _ = exported
    old = shutil.copytree(folder, tmp_path / "old")
    config = json.loads((old / "config.json").read_text())  # as a run's final/ saves it
    config["architectures"] = ["WhisperForConditionalGeneration"]
    (old / "config.json").write_text(json.dumps(config))
    row = json.loads((SPEECH / "eval.jsonl").read_text().splitlines()[0])
    clips = tmp_path / "clips.txt"
    clips.write_text(str(SPEECH / row["audio"]) + "\n")
    args = ["predict", str(old), "-i", str(clips), "--max-new-tokens", "4"]
    assert CliRunner().invoke(app, args).exit_code == 0  # the folder as exported: read
    (old / ENCODER).rename(old / "encoder.onnx")
    (old / DECODER).rename(old / "decoder.onnx")
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "re-export it with `ortft export RUN`" in lines[0], lines
