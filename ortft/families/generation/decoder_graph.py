"""A decoder's graph with its KV cache (causal-lm, instruction): the graph, its steps, and the
multi-step generation check (what every check shares: ``ortft.export.decoder``).

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

from ortft.export import decoder
from ortft.export.exporter import Graph

PROMPT_TOKENS = 8


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


def graph(model: Any, example: tuple[torch.Tensor, ...]) -> Graph:
    """The graph with its cache, traced from the plain graph's ``example`` (input_ids,
    attention_mask) after a past of 3 positions."""
    shape = cache_shape(model)
    inputs, outputs, axes = signature(shape[0])
    past = WithPast(model, shape[0]).eval()
    return Graph(past, tracing_example(example, shape), inputs, outputs, axes)


def cache_shape(model: Any) -> tuple[int, int, int]:
    """(layers, key/value heads, head dim) of the model's cache, read from one real step."""
    with torch.no_grad():
        out = model(input_ids=torch.zeros((1, 2), dtype=torch.long), use_cache=True)
    layers = out.past_key_values.layers
    _, heads, _, dim = layers[0].keys.shape
    return len(layers), int(heads), int(dim)


def signature(n_layers: int) -> tuple[list[str], list[str], dict[str, dict[int, str]]]:
    """(input names, output names, dynamic axes) of the graph with past."""
    inputs = ["input_ids", "attention_mask", *decoder.past_names(n_layers)]
    outputs = ["logits", *decoder.past_names(n_layers, "present")]
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


def generation_check(
    model: Any, path: Any, feeds: dict[str, np.ndarray], tolerance: float
) -> dict[str, Any]:
    """The graph (with its cache) generating as PyTorch's ``generate`` does, with the model's
    generation config (its logits processors, greedy or beam search: ``decoder.check_config``),
    on a few prompts from the parity samples; see ``decoder.compare`` (a tie on a tiny model
    says nothing about the graph). The compared steps' logits must also be within
    ``tolerance`` (a random tiny model can keep its greedy tokens with a broken cache:
    measured, a zeroed past moved the logits by 7e-4 and no token)."""
    from ortft.export import generation, parity

    session = parity.session(path)
    prompts = [
        [int(t) for t in ids[mask == 1][:PROMPT_TOKENS]]
        for ids, mask in zip(
            feeds["input_ids"][: decoder.GENERATE_PROMPTS],
            feeds["attention_mask"][: decoder.GENERATE_PROMPTS],
            strict=True,
        )
    ]
    gc = decoder.check_config(model, decoder.GENERATE_TOKENS)
    positions = getattr(model.config, "max_position_embeddings", None)
    totals = np.zeros(3, dtype=np.int64)  # steps compared, prompts that diverged, ties
    max_diff = 0.0
    for prompt in filter(None, prompts):
        x = torch.tensor([prompt])
        ref = decoder.reference(model, gc, input_ids=x, attention_mask=torch.ones_like(x))
        p = generation.plan(gc, len(prompt), encoder_decoder=False, max_positions=positions)
        seq, raw = generation.generate(CachedSteps(session), x.numpy(), p)
        eos = set() if p.eos is None else {int(e) for e in p.eos}
        *counts, diff = decoder.compare(ref, seq, raw, len(prompt), eos, p.num_beams)
        totals, max_diff = totals + counts, max(max_diff, diff)
    head = {
        "method": decoder.method(gc, decoder.GENERATE_TOKENS)
        + f", after up to {PROMPT_TOKENS} prompt tokens",
        "num_beams": int(gc.num_beams or 1),
        "prompts": len([p for p in prompts if p]),
    }
    compared, mismatches, ties = (int(n) for n in totals)
    return decoder.section(head, (compared, mismatches, ties), max_diff, tolerance)
