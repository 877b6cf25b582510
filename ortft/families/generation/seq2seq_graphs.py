"""Encoder-decoder (T5) export: ``encoder_model.onnx`` and ``decoder_model_merged.onnx`` with
both caches, in Optimum's layout (what transformers.js's ``text2text-generation`` opens).

- ``encoder_model.onnx``: ``input_ids``, ``attention_mask`` [batch, source] ->
  ``last_hidden_state``.
- ``decoder_model_merged.onnx`` (``ortft.export.cross_cache``): ``input_ids`` [batch, target],
  ``encoder_attention_mask``, ``encoder_hidden_states``, the self-attention past
  ``past_key_values.<layer>.decoder.key|value`` and the cross-attention's
  ``past_key_values.<layer>.encoder.key|value``, ``use_cache_branch`` -> ``logits`` and the
  ``present.*``. The first step (``use_cache_branch`` false) feeds the decoder start token and
  empty pasts and computes the cross-attention's keys and values; later steps read them.

The flat-tensor wrapper carries the caches (TorchScript cannot take ``Cache`` objects).

The checks (export.json): ``parity`` compares the teacher-forced logits (decoder fed the
shifted targets, empty past) with PyTorch's; ``generation`` the tokens the pair generates with the
model's generation config (its logits processors, greedy or beam search:
``ortft.export.generation``) against PyTorch's ``generate``, as for decoders.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from ortft.core.reports import ExportReport
from ortft.export import cross_cache, decoder, parity

ENCODER, DECODER = cross_cache.ENCODER, cross_cache.DECODER


class _Encoder(torch.nn.Module):
    def __init__(self, model: Any):
        super().__init__()
        self.encoder = model.get_encoder()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


class _Decoder(torch.nn.Module):
    """``cross`` False: the first step (the cross-attention computed and returned); True: the
    later ones (read from the past)."""

    def __init__(self, model: Any, n_layers: int, cross: bool):
        super().__init__()
        self.model, self.n_layers, self.cross = model, n_layers, cross

    def forward(self, input_ids, encoder_attention_mask, encoder_hidden_states, *past):
        out = self.model(
            decoder_input_ids=input_ids,
            encoder_outputs=(encoder_hidden_states,),
            attention_mask=encoder_attention_mask,
            past_key_values=cross_cache.cache(past, self.n_layers),
            use_cache=True,
            return_dict=True,
        )
        return (out.logits, *cross_cache.presents(out.past_key_values, not self.cross))


def _export(module, example, path: Path, inputs, outputs, axes, opset: int) -> None:
    from ortft.export import onnx_tools as tools

    with torch.no_grad(), tools.standard_symbolics():
        torch.onnx.export(
            module,
            example,
            str(path),
            input_names=inputs,
            output_names=outputs,
            dynamic_axes=axes,
            opset_version=opset,
            do_constant_folding=True,
            dynamo=False,
        )
    tools.check_portable(path)


def export_graphs(model: Any, feeds: dict[str, np.ndarray], folder: Path, opset: int):
    """Write both graphs to ``folder``; returns (decoder input names, output names)."""
    import onnx

    ids = torch.from_numpy(feeds["input_ids"][:2])
    mask = torch.from_numpy(feeds["attention_mask"][:2]).clone()
    mask[1, max(1, mask.shape[1] // 2) :] = 0  # a padded row keeps the mask in the graphs
    batch = {0: cross_cache.BATCH, 1: "encoder_sequence_length"}
    _export(
        _Encoder(model).eval(),
        (ids, mask),
        folder / ENCODER,
        ["input_ids", "attention_mask"],
        ["last_hidden_state"],
        {"input_ids": batch, "attention_mask": batch, "last_hidden_state": batch},
        opset,
    )
    with torch.no_grad():
        hidden = _Encoder(model).eval()(ids, mask)
        own = model(
            input_ids=ids, attention_mask=mask, decoder_input_ids=ids[:, :2], use_cache=True
        ).past_key_values.self_attention_cache
    layers, (_, heads, _, dim) = len(own.layers), own.layers[0].keys.shape
    head = {
        "input_ids": ids[:, :2],
        "encoder_attention_mask": mask,
        "encoder_hidden_states": hidden,
    }

    def make(cross: bool) -> torch.nn.Module:
        return _Decoder(model, layers, cross).eval()

    inputs, outputs = cross_cache.export(make, head, (heads, dim), layers, folder / DECODER, opset)
    onnx.checker.check_model(str(folder / ENCODER))
    return inputs, outputs


# --------------------------------------------------------------------------- running the pair


class OnnxSeq2Seq:
    """The two sessions of a seq2seq export, run as ``ortft eval`` / ``predict`` need them."""

    def __init__(self, folder: Path, config: Any, threads: int = 0):
        from ortft.export import generation

        cross_cache.refuse_old(Path(folder))
        self.encoder = parity.session(folder / ENCODER, threads)
        self.decoder = parity.session(folder / DECODER, threads)
        self.config = config
        self.generation_config = generation.load(folder, config)
        self.start = int(config.decoder_start_token_id)
        self.pad = int(config.pad_token_id)
        self.eos = config.eos_token_id

    def _decode(self, tokens, hidden, mask, past: cross_cache.Past) -> np.ndarray:
        """One step's logits; ``past`` takes the step's caches."""
        feeds = {"input_ids": tokens, "encoder_hidden_states": hidden, **past.feeds()}
        out = self.decoder.run(None, {**feeds, "encoder_attention_mask": mask})
        past.update(out)
        return out[0]

    def _encode(self, input_ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        feeds = {"input_ids": input_ids.astype(np.int64), "attention_mask": mask}
        return self.encoder.run(None, feeds)[0]

    def logits(self, input_ids: np.ndarray, attention_mask: np.ndarray, labels: np.ndarray):
        """Teacher-forced logits: the decoder fed the labels shifted right as the model's own
        forward shifts them (``decoder.shift_right``)."""
        dec = decoder.shift_right(labels, self.pad, self.start, self.config.model_type)
        mask = attention_mask.astype(np.int64)
        hidden = self._encode(input_ids, mask)
        past = cross_cache.Past(self.decoder, len(dec))
        return self._decode(dec.astype(np.int64), hidden, mask, past)

    def generate(
        self,
        input_ids: np.ndarray,
        attention_mask: np.ndarray,
        max_new_tokens: int,
        num_beams: int | None = 1,
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """Token ids as ``model.generate`` returns them (the start token, then the new tokens, a
        finished row padded) and each step's raw logits, with the export's generation config
        (``ortft.export.generation``). ``num_beams`` 1: greedy, as eval's generate metrics run
        PyTorch (``seq2seq``); None: the config's own (``ortft predict``)."""
        from ortft.export import generation

        fields: dict[str, Any] = {"max_new_tokens": max_new_tokens}
        if num_beams is not None:
            fields["num_beams"] = num_beams
        gc = generation.deterministic(self.generation_config, **fields)
        return self.search(input_ids, attention_mask, gc)

    def search(self, input_ids: np.ndarray, attention_mask: np.ndarray, gc: Any):
        """``generate`` with the generation config ``gc`` as it is."""
        from ortft.export import generation

        start = (
            gc.decoder_start_token_id if gc.decoder_start_token_id is not None else gc.bos_token_id
        )
        positions = getattr(self.config, "max_position_embeddings", None)
        p = generation.plan(gc, 1, encoder_decoder=True, max_positions=positions)
        mask = attention_mask.astype(np.int64)
        steps = cross_cache.Steps(self.decoder, self._decode, self._encode(input_ids, mask), mask)
        first = np.full((len(mask), 1), int(start), dtype=np.int64)
        return generation.generate(steps, first, p)


def check(
    model: Any,
    folder: Path,
    feeds: dict[str, np.ndarray],
    labels: np.ndarray,
    tolerance: float,
    max_new_tokens: int,
) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """(ONNX teacher-forced logits, PyTorch's, the generation section) on ``feeds``: the pair
    generating with the model's generation config as ``generate`` does (``decoder.compare``)."""
    pair = OnnxSeq2Seq(folder, model.config)
    ids, mask = torch.from_numpy(feeds["input_ids"]), torch.from_numpy(feeds["attention_mask"])
    with torch.no_grad():
        want = model(
            input_ids=ids, attention_mask=mask, labels=torch.from_numpy(labels), use_cache=False
        ).logits.numpy()
    got = pair.logits(feeds["input_ids"], feeds["attention_mask"], labels)
    n = decoder.GENERATE_PROMPTS
    gc = decoder.check_config(model, max_new_tokens)
    ref = decoder.reference(model, gc, input_ids=ids[:n], attention_mask=mask[:n])
    seq, raw = pair.search(feeds["input_ids"][:n], feeds["attention_mask"][:n], gc)
    eos = gc.eos_token_id if gc.eos_token_id is not None else []
    eos = {int(e) for e in np.atleast_1d(eos)}
    compared, mismatches, ties, max_diff = decoder.compare(
        ref, seq, raw, 1, eos, int(gc.num_beams or 1)
    )
    head = {
        "method": decoder.method(gc, max_new_tokens),
        "num_beams": int(gc.num_beams or 1),
        "prompts": int(len(ref.sequences)),
    }
    generation = decoder.section(head, (compared, mismatches, ties), max_diff, tolerance)
    return got.astype(np.float32), want, generation


def build_report(
    model: Any,
    folder: Path,
    samples: Any,
    feeds: dict[str, np.ndarray],
    *,
    opset: int,
    tolerance: float,
    source: str,
) -> ExportReport:
    """Export both graphs to ``folder``, check them, and return export.json's sections."""
    import time

    t0 = time.perf_counter()
    inputs, outputs = export_graphs(model, feeds, folder, opset)
    export_s = time.perf_counter() - t0
    labels = feeds.get("labels")
    if labels is None:  # synthetic samples: random targets of 8 tokens
        rng = np.random.default_rng(0)
        labels = rng.integers(0, model.config.vocab_size, (len(feeds["input_ids"]), 8))
    labels = labels.astype(np.int64)
    got, want, generation = check(model, folder, feeds, labels, tolerance, decoder.GENERATE_TOKENS)
    section = parity.teacher_forced(got, want, labels, tolerance, source)
    return {
        "format_version": parity.EXPORT_FORMAT_VERSION,
        "task": "seq2seq",
        "model_type": getattr(model.config, "model_type", None),
        "opset": opset,
        "files": {"encoder": ENCODER, "decoder": DECODER},
        "bytes": parity.dir_bytes(folder, ENCODER) + parity.dir_bytes(folder, DECODER),
        "export_s": round(export_s, 3),
        "inputs": {"encoder": ["input_ids", "attention_mask"], "decoder": inputs},
        "outputs": {"encoder": ["last_hidden_state"], "decoder": outputs},
        "kv_cache": True,
        "parity": section,
        "generation": generation,
    }
