"""Encoder-decoder (T5) export: ``encoder.onnx`` and ``decoder.onnx`` with its KV cache.

- ``encoder.onnx``: ``input_ids``, ``attention_mask`` [batch, source] -> ``last_hidden_state``.
- ``decoder.onnx``: ``input_ids`` [batch, target], ``encoder_hidden_states``,
  ``encoder_attention_mask``, ``past_key_values.<layer>.key|value`` (self-attention,
  [batch, heads, past, head_dim]) -> ``logits`` and ``present.<layer>.key|value``. The first
  step feeds the decoder start token and an empty past.

Only the self-attention cache crosses the graph boundary: the cross-attention keys and values
are recomputed from ``encoder_hidden_states`` at each step. Handing them over too would need a
graph for the first step (which computes them) and one for the later steps (which read them),
as Optimum does, because the choice is a Python branch in T5's attention (``is_updated``) that
tracing fixes. One decoder graph costs two projections of the encoder states per layer and
step (small next to the rest for short sources). The same flat-tensor wrapper as
``ortft.export.decoder`` carries the cache (TorchScript cannot take ``Cache`` objects).

The checks (export.json): ``parity`` compares the teacher-forced logits (decoder fed the
shifted targets, empty past) with PyTorch's; ``generation`` the greedy tokens with PyTorch's
``generate`` step by step, as for decoders.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from ortft.core.constants import IGNORE_INDEX
from ortft.export import decoder, parity

ENCODER, DECODER = "encoder.onnx", "decoder.onnx"


class _Encoder(torch.nn.Module):
    def __init__(self, model: Any):
        super().__init__()
        self.encoder = model.get_encoder()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


class _Decoder(torch.nn.Module):
    def __init__(self, model: Any, n_layers: int):
        super().__init__()
        self.model, self.n_layers = model, n_layers

    def forward(self, input_ids, encoder_hidden_states, encoder_attention_mask, *past):
        from transformers import DynamicCache, EncoderDecoderCache

        own = DynamicCache([(past[2 * i], past[2 * i + 1]) for i in range(self.n_layers)])
        out = self.model(
            decoder_input_ids=input_ids,
            encoder_outputs=(encoder_hidden_states,),
            attention_mask=encoder_attention_mask,
            past_key_values=EncoderDecoderCache(own, DynamicCache()),
            use_cache=True,
            return_dict=True,
        )
        cache = out.past_key_values.self_attention_cache
        return (out.logits, *[t for layer in cache.layers for t in (layer.keys, layer.values)])


def _export(module, example, path: Path, inputs, outputs, axes, opset: int) -> None:
    from ortft.export import onnx_tools as tools

    with torch.no_grad(), tools.standard_symbolics():
        torch.onnx.export(
            module, example, str(path), input_names=inputs, output_names=outputs,
            dynamic_axes=axes, opset_version=opset, do_constant_folding=True, dynamo=False,
        )  # fmt: skip
    tools.check_portable(path)


def export_graphs(model: Any, feeds: dict[str, np.ndarray], folder: Path, opset: int):
    """Write both graphs to ``folder``; returns (decoder input names, output names)."""
    import onnx

    ids = torch.from_numpy(feeds["input_ids"][:2])
    mask = torch.from_numpy(feeds["attention_mask"][:2]).clone()
    mask[1, max(1, mask.shape[1] // 2) :] = 0  # a padded row keeps the mask in the graphs
    batch = {0: "batch", 1: "source"}
    _export(
        _Encoder(model).eval(), (ids, mask), folder / ENCODER, ["input_ids", "attention_mask"],
        ["last_hidden_state"], {"input_ids": batch, "attention_mask": batch,
                                "last_hidden_state": batch}, opset,
    )  # fmt: skip
    with torch.no_grad():
        hidden = _Encoder(model).eval()(ids, mask)
        own = model(input_ids=ids, attention_mask=mask, decoder_input_ids=ids[:, :2],
                    use_cache=True).past_key_values.self_attention_cache  # fmt: skip
    layers, (_, heads, _, dim) = len(own.layers), own.layers[0].keys.shape
    gen = torch.Generator().manual_seed(0)
    past = [torch.randn(len(ids), heads, 3, dim, generator=gen) for _ in range(2 * layers)]
    inputs = ["input_ids", "encoder_hidden_states", "encoder_attention_mask"]
    inputs += decoder.past_names(layers)
    outputs = ["logits", *decoder.past_names(layers, "present")]
    axes: dict[str, dict[int, str]] = {
        "input_ids": {0: "batch", 1: "target"},
        "encoder_hidden_states": batch,
        "encoder_attention_mask": batch,
        "logits": {0: "batch", 1: "target"},
    }
    axes.update({n: {0: "batch", 2: "past_target"} for n in inputs[3:]})
    axes.update({n: {0: "batch", 2: "total_target"} for n in outputs[1:]})
    example = (ids[:, :2], hidden, mask, *past)
    _export(_Decoder(model, layers).eval(), example, folder / DECODER, inputs, outputs, axes, opset)
    for name in (ENCODER, DECODER):
        onnx.checker.check_model(str(folder / name))
    return inputs, outputs


# --------------------------------------------------------------------------- running the pair


class OnnxSeq2Seq:
    """The two sessions of a seq2seq export, run as ``ortft eval`` / ``predict`` need them."""

    def __init__(self, folder: Path, config: Any, threads: int = 0):
        self.encoder = parity.session(folder / ENCODER, threads)
        self.decoder = parity.session(folder / DECODER, threads)
        self.start = int(config.decoder_start_token_id)
        self.pad = int(config.pad_token_id)
        self.eos = config.eos_token_id

    def _decode(self, tokens, hidden, mask, past) -> list[np.ndarray]:
        feeds = {"input_ids": tokens, "encoder_hidden_states": hidden}
        return self.decoder.run(None, {**feeds, "encoder_attention_mask": mask, **past})

    def logits(self, input_ids: np.ndarray, attention_mask: np.ndarray, labels: np.ndarray):
        """Teacher-forced logits: the decoder fed the labels shifted right (as T5 does)."""
        dec = np.full_like(labels, self.pad)
        dec[:, 0] = self.start
        dec[:, 1:] = np.where(labels[:, :-1] == IGNORE_INDEX, self.pad, labels[:, :-1])
        mask = attention_mask.astype(np.int64)
        hidden = self.encoder.run(
            None, {"input_ids": input_ids.astype(np.int64), "attention_mask": mask}
        )[0]
        return self._decode(
            dec.astype(np.int64), hidden, mask, parity.empty_past(self.decoder, len(dec))
        )[0]

    def generate(self, input_ids: np.ndarray, attention_mask: np.ndarray, max_new_tokens: int):
        """Greedy token ids as ``model.generate`` returns them: the start token, then one token a
        step, a finished row padded; the logits of each step too (for the export's check)."""
        mask = attention_mask.astype(np.int64)
        hidden = self.encoder.run(
            None, {"input_ids": input_ids.astype(np.int64), "attention_mask": mask}
        )[0]
        past = parity.empty_past(self.decoder, len(mask))
        tokens = np.full((len(mask), 1), self.start, dtype=np.int64)
        seq, steps, done = [tokens], [], np.zeros(len(mask), dtype=bool)
        for _ in range(max_new_tokens):
            out = self._decode(tokens, hidden, mask, past)
            steps.append(out[0][:, -1])
            nxt = np.where(done, self.pad, out[0][:, -1].argmax(-1))
            done |= nxt == self.eos
            tokens = nxt[:, None].astype(np.int64)
            seq.append(tokens)
            past = dict(zip(past, out[1:], strict=True))
            if done.all():
                break
        return np.concatenate(seq, axis=1), steps


def check(
    model: Any, folder: Path, feeds: dict[str, np.ndarray], labels: np.ndarray,
    tolerance: float, max_new_tokens: int,
) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:  # fmt: skip
    """(ONNX teacher-forced logits, PyTorch's, the generation section) on ``feeds``."""
    pair = OnnxSeq2Seq(folder, model.config)
    ids, mask = torch.from_numpy(feeds["input_ids"]), torch.from_numpy(feeds["attention_mask"])
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask, labels=torch.from_numpy(labels),
                     use_cache=False).logits.numpy()  # fmt: skip
    got = pair.logits(feeds["input_ids"], feeds["attention_mask"], labels)
    n = decoder.GENERATE_PROMPTS
    with torch.no_grad():
        ref = model.generate(input_ids=ids[:n], attention_mask=mask[:n], do_sample=False,
                             num_beams=1, max_new_tokens=max_new_tokens, output_logits=True,
                             return_dict_in_generate=True)  # fmt: skip
    seq, steps = pair.generate(feeds["input_ids"][:n], feeds["attention_mask"][:n], max_new_tokens)
    compared, mismatches, max_diff = 0, 0, 0.0
    for row in range(len(ref.sequences)):
        for t, ref_logits in enumerate(ref.logits):
            r = ref_logits[row].float().numpy()
            if int(ref.sequences[row, t]) in (pair.eos, pair.pad) and t > 0:
                break  # the row had finished
            top2 = np.sort(r.astype(np.float64))[-2:]
            if top2[1] - top2[0] < decoder.MIN_MARGIN or t >= len(steps):
                break
            compared += 1
            max_diff = max(max_diff, float(np.max(np.abs(steps[t][row] - r))))
            if int(seq[row, t + 1]) != int(ref.sequences[row, t + 1]):
                mismatches += 1
                break
    generation = {
        "method": f"greedy, up to {max_new_tokens} new tokens, against transformers' generate; "
        f"compared until a top-2 margin < {decoder.MIN_MARGIN}",
        "prompts": int(len(ref.sequences)),
        "steps_compared": compared,
        "mismatches": mismatches,
        "max_abs_diff": max_diff,
        "tolerance": tolerance,
        "passed": mismatches == 0 and compared > 0 and max_diff <= tolerance,
    }
    return got.astype(np.float32), want, generation


def build_report(
    model: Any, folder: Path, samples: Any, feeds: dict[str, np.ndarray], *,
    opset: int, tolerance: float, source: str,
) -> dict[str, Any]:  # fmt: skip
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
    targets = {"attention_mask": (labels != IGNORE_INDEX).astype(np.int64), "labels": labels}
    j = parity.judge(got, want, targets, "token")
    section = {"samples": int(len(labels)), "source": source, "against": "teacher-forced logits"}
    section.update(
        max_abs_diff=j["max_abs_diff"],
        prediction_agreement=j["prediction_agreement"],
        tolerance=tolerance,
    )
    section["passed"] = parity.passed("parity", section)
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
