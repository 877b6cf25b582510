"""Decoders with a KV cache: the graph, its names, and the multi-step generation check.

Why a wrapper: transformers 5 passes the cache as a ``Cache`` object (``DynamicCache``), which
torch 2.6's TorchScript exporter (``torch.onnx.export(..., dynamo=False)``, the one ortft uses:
see exporter.DEFAULT_OPSET) cannot take as an input or give as an output: it flattens tensors,
tuples and lists only. ``WithPast.forward`` therefore takes the past as flat per-layer key and
value tensors, builds a ``DynamicCache`` from them inside, and returns the cache's tensors flat
again. Traced with a non-empty past and a padded row (so the mask stays in the graph), the
graph runs with any past length, 0 included: the first step feeds empty past tensors, so one
graph serves the prompt and every later token. Measured on torch 2.6 / transformers 5.24 for
GPT-2 (opset 20): ONNX Runtime 1.19.2 and 1.32.0 load it, greedy tokens equal PyTorch's
``generate`` and the step logits differ by ~1e-7.

Names follow Optimum's decoders: inputs ``input_ids`` [batch, sequence], ``attention_mask``
[batch, past + sequence], ``past_key_values.<layer>.key|value`` [batch, heads, past, head_dim];
outputs ``logits`` and ``present.<layer>.key|value`` [batch, heads, past + sequence, head_dim].
Positions are ``past .. past + sequence - 1`` (no position_ids input): right for one text or
right-padded batches, as ``ortft predict`` feeds them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

GENERATE_PROMPTS, GENERATE_TOKENS = 4, 16  # the generation check: prompts x new tokens
PROMPT_TOKENS = 8
MIN_MARGIN = 1e-4  # top-2 logit margin below which a step is a tie, not a test of the graph


def past_names(n_layers: int, prefix: str = "past_key_values") -> list[str]:
    return [f"{prefix}.{i}.{kv}" for i in range(n_layers) for kv in ("key", "value")]


class WithPast(torch.nn.Module):
    """(input_ids, attention_mask, *flat past) -> (logits, *flat present); see the module doc."""

    def __init__(self, model: torch.nn.Module, n_layers: int):
        super().__init__()
        self.model, self.n_layers = model, n_layers

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *past: torch.Tensor):
        from transformers import DynamicCache

        cache = DynamicCache([(past[2 * i], past[2 * i + 1]) for i in range(self.n_layers)])
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            past_key_values=cache,
            use_cache=True,
            return_dict=True,
        )
        flat = [t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)]
        return (out.logits, *flat)


def cache_shape(model: Any) -> tuple[int, int, int]:
    """(layers, key/value heads, head dim) of the model's cache, read from one real step."""
    with torch.no_grad():
        out = model(input_ids=torch.zeros((1, 2), dtype=torch.long), use_cache=True)
    layers = out.past_key_values.layers
    _, heads, _, dim = layers[0].keys.shape
    return len(layers), int(heads), int(dim)


def signature(n_layers: int) -> tuple[list[str], list[str], dict[str, dict[int, str]]]:
    """(input names, output names, dynamic axes) of the graph with past."""
    inputs = ["input_ids", "attention_mask", *past_names(n_layers)]
    outputs = ["logits", *past_names(n_layers, "present")]
    axes = {
        "input_ids": {0: "batch", 1: "sequence"},
        "attention_mask": {0: "batch", 1: "total_sequence"},
        "logits": {0: "batch", 1: "sequence"},
    }
    axes.update({n: {0: "batch", 2: "past_sequence"} for n in inputs[2:]})
    axes.update({n: {0: "batch", 2: "total_sequence"} for n in outputs[1:]})
    return inputs, outputs, axes


def tracing_example(
    example: tuple[torch.Tensor, ...], shape: tuple[int, int, int]
) -> tuple[torch.Tensor, ...]:
    """``example`` (two rows, the second partly padded) after a past of 3 random positions."""
    ids, mask = example
    layers, heads, dim = shape
    gen = torch.Generator().manual_seed(0)
    past = [torch.randn(len(ids), heads, 3, dim, generator=gen) for _ in range(2 * layers)]
    full_mask = torch.cat([torch.ones(len(ids), 3, dtype=mask.dtype), mask], dim=1)
    return (ids, full_mask, *past)


def _margin(scores: np.ndarray) -> float:
    top2 = np.sort(scores.astype(np.float64))[-2:]
    return float(top2[1] - top2[0])


class CachedSteps:
    """``generation.Steps`` over the graph with past: the prompt once, then one token a call."""

    def __init__(self, session: Any):
        self.session, self.seen = session, 0
        self.past: dict[str, np.ndarray] | None = None

    def __call__(self, tokens: np.ndarray) -> np.ndarray:
        from ortft.export import parity

        if self.past is None:  # the first call: an empty past for every row (beams included)
            self.past = parity.empty_past(self.session, len(tokens))
        self.seen += tokens.shape[1]
        feeds = {"input_ids": tokens.astype(np.int64), **self.past}
        feeds["attention_mask"] = np.ones((len(tokens), self.seen), np.int64)
        out = self.session.run(None, feeds)
        self.past = dict(zip(self.past, out[1:], strict=True))
        return out[0][:, -1]

    def reorder(self, rows: np.ndarray) -> None:
        self.past = {k: v[rows] for k, v in (self.past or {}).items()}


class WholeSteps:
    """``generation.Steps`` for a graph without a cache: the whole sequence each call."""

    def __init__(self, logits: Any):
        self.logits = logits  # logits(input_ids, attention_mask) -> [b, s, v]
        self.ids: np.ndarray | None = None

    def __call__(self, tokens: np.ndarray) -> np.ndarray:
        ids = tokens if self.ids is None else np.concatenate([self.ids, tokens], axis=1)
        self.ids = ids.astype(np.int64)
        return self.logits(self.ids, np.ones_like(self.ids))[:, -1]

    def reorder(self, rows: np.ndarray) -> None:
        self.ids = None if self.ids is None else self.ids[rows]


def check_config(model: Any, max_new_tokens: int) -> Any:
    """The model's generation config as the generation check runs it on both sides: sampling off,
    ``max_new_tokens``, and without the options ``ortft.export.generation`` does not apply."""
    from transformers import GenerationConfig

    from ortft.export import generation

    gc = getattr(model, "generation_config", None)
    gc = gc if gc is not None else GenerationConfig.from_model_config(model.config)
    gc = generation.deterministic(gc, max_new_tokens=max_new_tokens)
    for key in generation.unsupported(gc):
        setattr(gc, key, None)
    return gc


def reference(model: Any, gc: Any, **inputs: torch.Tensor) -> Any:
    """PyTorch's ``generate`` with ``gc``: the sequences, raw logits and processed scores."""
    from ortft.export import generation

    ref = generation.deterministic(
        gc, output_logits=True, output_scores=True, return_dict_in_generate=True
    )
    with torch.no_grad():
        return model.generate(**inputs, generation_config=ref)


def compare(
    ref: Any, seq: np.ndarray, raw: list[np.ndarray], start: int, eos: set[int], beams: int
) -> tuple[int, int, int, float]:
    """(steps compared, rows that diverged, rows stopped at a tie, max |logit diff|) of the ONNX
    loop's ``seq`` and ``raw`` logits against ``generate``'s ``ref``, new tokens from ``start``.
    Greedy: step by step, until a top-2 margin of the processed scores < ``MIN_MARGIN`` (a
    tie) or the row's eos. Beams: the whole sequences; the logits of every step when they agree
    (the beams then ran in the same order), else of the prompt's step."""
    want = ref.sequences.numpy()
    ref_logits = [t.float().numpy() for t in ref.logits]
    if beams > 1:
        width = max(want.shape[1], seq.shape[1])
        a, b = (
            np.pad(x, ((0, 0), (0, width - x.shape[1])), constant_values=-1) for x in (want, seq)
        )
        diverged = int(np.sum(np.any(a != b, axis=1)))
        steps = min(len(ref_logits), len(raw)) if diverged == 0 else 1
        diff = max(float(np.max(np.abs(raw[t] - ref_logits[t]))) for t in range(steps))
        return steps * len(want), diverged, 0, diff
    compared, diverged, ties, diff = 0, 0, 0, 0.0
    for row in range(len(want)):
        for t in range(min(len(ref_logits), len(raw))):
            if _margin(ref.scores[t][row].float().numpy()) < MIN_MARGIN:
                ties += 1
                break
            compared += 1
            diff = max(diff, float(np.max(np.abs(raw[t][row] - ref_logits[t][row]))))
            pos = start + t
            if pos >= seq.shape[1] or seq[row, pos] != want[row, pos]:
                diverged += 1
                break
            if int(want[row, pos]) in eos:
                break
    return compared, diverged, ties, diff


def method(gc: Any, max_new_tokens: int) -> str:
    """export.json's words for what the check ran."""
    beams = int(gc.num_beams or 1)
    how = f"beam search ({beams} beams)" if beams > 1 else "greedy"
    return (
        f"{how} with the model's generation config, up to {max_new_tokens} new tokens, against "
        f"transformers' generate; greedy steps compared until a top-2 margin < {MIN_MARGIN}"
    )


def generation_check(
    model: Any, path: Any, feeds: dict[str, np.ndarray], tolerance: float
) -> dict[str, Any]:
    """The graph (with its cache) generating as PyTorch's ``generate`` does, with the model's
    generation config (its logits processors, greedy or beam search: ``check_config``), on a
    few prompts from the parity samples; see ``compare`` (a tie on a tiny model says nothing
    about the graph). The compared steps' logits must also be within ``tolerance`` (a random
    tiny model can keep its greedy tokens with a broken cache: measured, a zeroed past moved
    the logits by 7e-4 and no token)."""
    from ortft.export import generation, parity

    session = parity.session(path)
    prompts = [
        [int(t) for t in ids[mask == 1][:PROMPT_TOKENS]]
        for ids, mask in zip(
            feeds["input_ids"][:GENERATE_PROMPTS],
            feeds["attention_mask"][:GENERATE_PROMPTS],
            strict=True,
        )
    ]
    gc = check_config(model, GENERATE_TOKENS)
    positions = getattr(model.config, "max_position_embeddings", None)
    totals = np.zeros(3, dtype=np.int64)  # steps compared, prompts that diverged, ties
    max_diff = 0.0
    for prompt in filter(None, prompts):
        x = torch.tensor([prompt])
        ref = reference(model, gc, input_ids=x, attention_mask=torch.ones_like(x))
        p = generation.plan(gc, len(prompt), encoder_decoder=False, max_positions=positions)
        seq, raw = generation.generate(CachedSteps(session), x.numpy(), p)
        eos = set() if p.eos is None else {int(e) for e in p.eos}
        *counts, diff = compare(ref, seq, raw, len(prompt), eos, p.num_beams)
        totals, max_diff = totals + counts, max(max_diff, diff)
    compared, mismatches, ties = (int(n) for n in totals)
    return {
        "method": method(gc, GENERATE_TOKENS) + f", after up to {PROMPT_TOKENS} prompt tokens",
        "num_beams": int(gc.num_beams or 1),
        "prompts": len([p for p in prompts if p]),
        "steps_compared": compared,
        "stopped_at_ties": ties,
        "mismatches": mismatches,
        "max_abs_diff": max_diff,
        "tolerance": tolerance,
        "passed": mismatches == 0 and compared > 0 and max_diff <= tolerance,
    }
