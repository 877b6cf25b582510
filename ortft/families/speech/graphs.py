"""Speech recognition (Whisper) export: ``encoder_model.onnx``, ``decoder_model_merged.onnx``
with both caches and ``features.onnx``, each checked against PyTorch; run by
``ortft.families.speech.runner``. The two graphs are Optimum's layout, which transformers.js's
``automatic-speech-recognition`` pipeline opens.

- ``encoder_model.onnx``: ``input_features`` float32 [batch, mel, frames] (frames fixed:
  Whisper's encoder refuses any other length) -> ``last_hidden_state``.
- ``decoder_model_merged.onnx`` (``ortft.export.cross_cache``): ``input_ids`` [batch, target],
  ``encoder_hidden_states``, ``past_key_values.<layer>.decoder|encoder.key|value``,
  ``use_cache_branch`` -> ``logits`` and the ``present.*``. Whisper's decoder has no encoder
  attention mask (every frame is real: the features are padded with silence). The first step
  (``use_cache_branch`` false) feeds the init tokens
  (``<|startoftranscript|><|en|><|transcribe|><|notimestamps|>``) and empty pasts, and computes
  the cross-attention's keys and values from the encoder's states; later steps read them, which
  saves two projections of Whisper's 1500 frames per layer and step (docs/speech.md has the
  step times).
- ``features.onnx`` (``ortft.families.speech.features``): the raw clip -> ``input_features``.

The decoder is traced with a cache (3 random past positions, 2 tokens). Without one,
transformers 5.24's mask code calls ``torch.diff`` (``find_packed_sequence_indices``: no
attention mask, no cache), which torch 2.6 cannot export (measured: UnsupportedOperatorError
``aten::diff`` at opset 20); with a cache it is not called.

The checks (export.json): ``parity``: teacher-forced logits against PyTorch's (labels shifted
right, empty past); ``generation``: the pair generating as Whisper's ``generate`` does (its init
tokens and suppressors, greedy or beam search) against it, step by step (``decoder.compare``),
and the tokens it returns; ``features``: features.onnx against the feature extractor on the
clips' decoded audio (gated like parity); ``end_to_end`` (recorded, not gated: features.onnx
may be 1e-3 off the extractor, which can flip a near tie): the raw clips through features.onnx
and the pair against PyTorch's generate on the extractor's features, transcripts compared.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ortft.core.constants import IGNORE_INDEX
from ortft.core.reports import ExportReport, ParityReport
from ortft.export import cross_cache, decoder, generation, parity
from ortft.families.speech.runner import DECODER, ENCODER, FEATURES, OnnxWhisper, refuse
from ortft.families.speech.task import PATH

# Clips parity runs on: the logits are [clips, target, vocab] twice (PyTorch's and ONNX's), 210 MB
# each for 16 clips of 64 tokens over Whisper's 51865 ids
MAX_CLIPS = 16
END_TO_END_CLIPS = 8
SYNTHETIC_LABELS = 8  # random target tokens per synthetic clip


class _Encoder(torch.nn.Module):
    def __init__(self, model: Any):
        super().__init__()
        self.encoder = model.get_encoder()

    def forward(self, input_features: torch.Tensor) -> torch.Tensor:
        return self.encoder(input_features=input_features).last_hidden_state


class _Decoder(torch.nn.Module):
    """(input_ids, encoder_hidden_states, *flat past) -> (logits, *flat present): ``cross``
    False, the first step (the cross-attention computed from the states and returned), True,
    the later ones (it is read from the past): ``ortft.export.cross_cache``."""

    def __init__(self, model: Any, n_layers: int, cross: bool):
        super().__init__()
        self.model, self.n_layers, self.cross = model, n_layers, cross

    def forward(self, input_ids, encoder_hidden_states, *past):
        out = self.model(
            decoder_input_ids=input_ids,
            encoder_outputs=(encoder_hidden_states,),
            cache=cross_cache.cache(past, self.n_layers),
            use_cache=True,
            return_dict=True,
        )
        return (out.logits, *cross_cache.presents(out.cache, not self.cross))


def export_graphs(model: Any, input_features: np.ndarray, folder: Path, opset: int):
    """Write encoder_model.onnx and decoder_model_merged.onnx to ``folder``; (decoder inputs,
    decoder outputs)."""
    from ortft.export import onnx_tools as tools

    feats = torch.from_numpy(np.ascontiguousarray(input_features[:2], dtype=np.float32))
    if len(feats) < 2:  # a batch of 2 keeps the batch axis a variable
        feats = torch.cat([feats, feats])
    batch = {0: cross_cache.BATCH}
    enc = _Encoder(model).eval()
    enc_axes = {"input_features": batch, "last_hidden_state": batch}
    names = (["input_features"], ["last_hidden_state"])
    tools.torch_export(enc, (feats,), folder / ENCODER, opset, *names, enc_axes)
    c = model.config
    layers, heads = int(c.decoder_layers), int(c.decoder_attention_heads)
    with torch.no_grad():
        hidden = enc(feats)
    ids = torch.full((2, 2), int(c.decoder_start_token_id), dtype=torch.long)
    head = {"input_ids": ids, "encoder_hidden_states": hidden}
    shape = (heads, int(c.d_model) // heads)

    def make(cross: bool) -> torch.nn.Module:
        return _Decoder(model, layers, cross).eval()

    return cross_cache.export(make, head, shape, layers, folder / DECODER, opset)


# --------------------------------------------------------------------------- the clips


def _synthetic(n: int, rate: int, seconds: float, rng: np.random.Generator) -> list[np.ndarray]:
    """Tones in noise, 0.3 s to a little over the extractor's window (so it cuts some)."""
    out = []
    for _ in range(n):
        t = np.arange(int(rng.uniform(0.3, 1.2 * seconds) * rate)) / rate
        tone = np.sin(2 * np.pi * rng.uniform(100, 3000) * t) * rng.uniform(0.05, 0.5)
        out.append((tone + rng.normal(0, 0.02, len(t))).astype(np.float32))
    return out


def clips(
    task: Any, processor: Any, samples: Any, n: int, vocab: int
) -> tuple[dict[str, np.ndarray], list[np.ndarray], str]:
    """(feeds: input_features and labels, the decoded clips, source): up to ``n`` held-out clips
    through ``task.collate`` (eval's path) and decoded as the task decodes them; else ``n``
    synthetic clips through the feature extractor, with random labels ("synthetic")."""
    fe = processor.feature_extractor
    rate, seconds = int(fe.sampling_rate), float(fe.n_samples) / float(fe.sampling_rate)
    if samples is not None and len(samples):
        batch = samples.take(np.arange(min(n, len(samples))))
        task.bind(processor)
        feats = task.collate(batch, None, 0)["input_features"]
        labels = np.asarray(batch["labels"], dtype=np.int64)
        # the labels are padded to task.max_target_length (448): cut to the longest, as batches
        real = np.flatnonzero(np.any(labels != IGNORE_INDEX, axis=0))
        labels = labels[:, : int(real[-1]) + 1 if len(real) else 1]
        return {"input_features": feats, "labels": labels}, task.clips(batch[PATH]), "eval data"
    rng = np.random.default_rng(0)
    decoded = _synthetic(n, rate, seconds, rng)
    feats = fe(decoded, sampling_rate=rate, return_tensors="np").input_features
    labels = rng.integers(0, vocab, (n, SYNTHETIC_LABELS), dtype=np.int64)
    return {"input_features": feats, "labels": labels}, decoded, "synthetic"


# --------------------------------------------------------------------------- the checks


def check_parity(
    model: Any, pair: OnnxWhisper, feeds: dict, tolerance: float, source: str
) -> ParityReport:
    """export.json's ``parity``: teacher-forced logits against PyTorch's forward with labels
    (no decoder mask: the padded positions are compared too, and match as they are computed
    the same way on both sides)."""
    feats, labels = feeds["input_features"], feeds["labels"]
    with torch.no_grad():
        want = (
            model(
                input_features=torch.from_numpy(feats),
                labels=torch.from_numpy(labels),
                use_cache=False,
            )
            .logits.float()
            .numpy()
        )
    got = pair.logits(feats, labels).astype(np.float32)
    return parity.teacher_forced(got, want, labels, tolerance, source)


def _reference(model: Any, gc: Any, feats: np.ndarray) -> tuple[Any, np.ndarray]:
    """PyTorch's generate on ``feats``: (the dict output with logits and scores, the ids it
    returns plainly)."""
    x = torch.from_numpy(feats)
    ref = decoder.reference(model, gc, input_features=x)
    with torch.no_grad():
        plain = model.generate(input_features=x, generation_config=gc)
    return ref, plain.numpy()


def check_generation(model: Any, pair: OnnxWhisper, feats: np.ndarray, tolerance: float):
    """export.json's ``generation``: the pair generating with the model's generation config
    (``decoder.check_config``) on a few clips, against Whisper's ``generate``: step by step from
    the init tokens (``decoder.compare``; beams: the sequences and the first step's logits, one
    clip at a time), then the tokens each returns (init tokens and eos taken off)."""
    from ortft.families.speech import runner

    gc = decoder.check_config(model, decoder.GENERATE_TOKENS)
    beams = int(gc.num_beams or 1)
    eos = {int(e) for e in np.atleast_1d(gc.eos_token_id if gc.eos_token_id is not None else [])}
    n = min(decoder.GENERATE_PROMPTS, len(feats))
    groups = [slice(0, n)] if beams == 1 else [slice(i, i + 1) for i in range(n)]
    totals, max_diff, outputs_equal = np.zeros(3, dtype=np.int64), 0.0, True
    for rows in groups:
        ref, plain = _reference(model, gc, feats[rows])
        seq, raw, k = pair.search(feats[rows], gc)
        if beams > 1:  # generate's split keeps one row of each step's [beams, vocab] logits
            ref.logits = ref.logits[:1]
        *counts, diff = decoder.compare(ref, seq, raw, k, eos, beams)
        totals, max_diff = totals + counts, max(max_diff, diff)
        mine = runner.padded(runner.new_tokens(seq, k, gc), int(gc.pad_token_id or 0))
        outputs_equal &= mine.shape == plain.shape and bool(np.all(mine == plain))
    head = {
        "method": decoder.method(gc, decoder.GENERATE_TOKENS)
        + ", after Whisper's init tokens and with its suppressors",
        "num_beams": beams,
        "clips": n,
    }
    compared, mismatches, ties = (int(x) for x in totals)
    return decoder.section(head, (compared, mismatches, ties), max_diff, tolerance, outputs_equal)


def check_features(folder: Path, fe: Any, decoded: list[np.ndarray], source: str):
    """export.json's ``features``: features.onnx written and checked against the extractor on
    each decoded clip, or why there is none (``exported: false``)."""
    from ortft.families.speech import features as audio_features

    problem = audio_features.supported_problem(fe)
    if problem is not None:
        return {"exported": False, "reason": problem}
    described = audio_features.write(fe, folder / FEATURES)
    diff = 0.0
    for clip in decoded:
        got = audio_features.run(folder / FEATURES, clip)
        want = fe(clip, sampling_rate=fe.sampling_rate, return_tensors="np").input_features
        diff = max(diff, float(np.max(np.abs(got - want))))
    return {
        "exported": True,
        "file": FEATURES,
        **described,
        "nb_max_frames": int(fe.nb_max_frames),
        "clips": len(decoded),
        "source": source,
        "max_abs_diff": diff,
        "tolerance": audio_features.TOLERANCE,
        "passed": diff <= audio_features.TOLERANCE,
    }


def end_to_end(model: Any, pair: OnnxWhisper, processor: Any, decoded: list[np.ndarray]):
    """export.json's ``end_to_end`` (not gated): each raw clip through features.onnx and the
    pair, against PyTorch's generate on the extractor's features; transcripts compared."""
    gc = decoder.check_config(model, decoder.GENERATE_TOKENS)
    fe, tok = processor.feature_extractor, processor.tokenizer
    chosen = decoded[:END_TO_END_CLIPS]
    got = pair.transcribe(chosen, decoder.GENERATE_TOKENS)
    feats = fe(chosen, sampling_rate=fe.sampling_rate, return_tensors="pt").input_features
    with torch.no_grad():
        want = model.generate(input_features=feats, generation_config=gc)
    texts = tok.batch_decode(got, skip_special_tokens=True)
    ref = tok.batch_decode(want, skip_special_tokens=True)
    return {
        "clips": len(chosen),
        "transcripts_equal": sum(a == b for a, b in zip(texts, ref, strict=True)),
        "max_new_tokens": decoder.GENERATE_TOKENS,
        "gated": False,
    }


# --------------------------------------------------------------------------- the exporter's job


class SpeechGraphs:
    """``build`` fills the staging folder: the encoder, the merged decoder, features.onnx, the
    processor, config and generation config, and returns export.json's sections (the caller
    adds the runtimes and the card: ``exporter.deployable``)."""

    def __init__(
        self,
        model: Any,
        processor: Any,
        task: Any,
        *,
        opset: int,
        tolerance: float,
        samples: Any,
        n: int,
    ):
        refuse(model.generation_config)  # before exporting what could not be run
        self.model, self.processor, self.task = model.eval(), processor, task
        self.opset, self.tolerance = opset, tolerance
        vocab = int(model.config.vocab_size)
        self.feeds, self.decoded, self.source = clips(
            task, processor, samples, min(n, MAX_CLIPS), vocab
        )

    @property
    def runtime_feeds(self) -> dict[str, np.ndarray]:
        """What ``--check-runtime`` runs each graph on (``deploy.graph_feeds``): the features,
        4 decoder tokens (the shifted labels' first), one raw clip (``samples``)."""
        from ortft.export.decoder import shift_right

        c = self.model.config
        dec = shift_right(
            self.feeds["labels"], int(c.pad_token_id), int(c.decoder_start_token_id), "whisper"
        )
        return {
            "input_features": self.feeds["input_features"],
            "input_ids": np.ascontiguousarray(dec[:, :4]),
            "samples": self.decoded[0],
        }

    def build(self, tmp: Path) -> ExportReport:
        model, feeds = self.model, self.feeds
        t0 = time.perf_counter()
        inputs, outputs = export_graphs(model, feeds["input_features"], tmp, self.opset)
        export_s = time.perf_counter() - t0
        self.processor.save_pretrained(tmp)  # processor_config.json (the extractor), tokenizer
        # transformers.js reads the feature extractor from preprocessor_config.json alone
        self.processor.feature_extractor.save_pretrained(tmp)
        generation.save(model, tmp)  # config.json, generation_config.json
        pair = OnnxWhisper(tmp, model.config)
        features = check_features(tmp, self.processor.feature_extractor, self.decoded, self.source)
        files = {"encoder": ENCODER, "decoder": DECODER}
        result: ExportReport = {
            "format_version": parity.EXPORT_FORMAT_VERSION,
            "task": getattr(self.task, "name", "speech-recognition"),
            "model_type": getattr(model.config, "model_type", None),
            "opset": self.opset,
            "files": files,
            "bytes": parity.dir_bytes(tmp, ENCODER) + parity.dir_bytes(tmp, DECODER),
            "export_s": round(export_s, 3),
            "inputs": {"encoder": ["input_features"], "decoder": inputs},
            "outputs": {"encoder": ["last_hidden_state"], "decoder": outputs},
            "kv_cache": True,
            "language": getattr(model.generation_config, "language", None),  # the init tokens'
            "parity": check_parity(model, pair, feeds, self.tolerance, self.source),
            "generation": check_generation(model, pair, feeds["input_features"], self.tolerance),
            "features": features,
        }
        if features.get("passed"):
            files["features"] = FEATURES
            result["end_to_end"] = end_to_end(model, pair, self.processor, self.decoded)
        return result
