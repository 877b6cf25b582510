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


def _margin(logits: np.ndarray) -> float:
    top2 = np.sort(logits.astype(np.float64))[-2:]
    return float(top2[1] - top2[0])


def generation_check(
    model: Any, path: Any, feeds: dict[str, np.ndarray], tolerance: float
) -> dict[str, Any]:
    """Greedy tokens of the graph (with its cache) against PyTorch's ``generate``, step by step
    on a few prompts from the parity samples, until a step's top-2 margin in PyTorch's logits
    falls below ``MIN_MARGIN`` (a tie on a tiny model says nothing about the graph). The
    compared steps' logits must also be within ``tolerance`` (a random tiny model can keep
    its greedy tokens with a broken cache: measured, a zeroed past moved the logits by 7e-4
    and no token)."""
    from ortft.export import parity

    session = parity.session(path)
    prompts = [
        [int(t) for t in ids[mask == 1][:PROMPT_TOKENS]]
        for ids, mask in zip(
            feeds["input_ids"][:GENERATE_PROMPTS],
            feeds["attention_mask"][:GENERATE_PROMPTS],
            strict=True,
        )
    ]
    compared, mismatches, ties, max_diff = 0, 0, 0, 0.0
    pad = getattr(model.config, "eos_token_id", None)
    for prompt in filter(None, prompts):
        x = torch.tensor([prompt])
        with torch.no_grad():
            ref = model.generate(
                x, attention_mask=torch.ones_like(x), max_new_tokens=GENERATE_TOKENS,
                do_sample=False, pad_token_id=pad, output_logits=True, return_dict_in_generate=True,
            )  # fmt: skip
        want = ref.sequences[0, len(prompt) :].tolist()
        got, logits = parity.greedy(session, prompt, len(want))
        for t, w in enumerate(want):
            ref_logits = ref.logits[t][0].float().numpy()
            if _margin(ref_logits) < MIN_MARGIN:
                ties += 1
                break
            compared += 1
            max_diff = max(max_diff, float(np.max(np.abs(logits[t] - ref_logits))))
            if t >= len(got) or got[t] != w:
                mismatches += 1
                break
    return {
        "method": f"greedy, {GENERATE_TOKENS} new tokens after up to {PROMPT_TOKENS} prompt "
        f"tokens, against transformers' generate; compared until a top-2 margin < {MIN_MARGIN}",
        "prompts": len([p for p in prompts if p]),
        "steps_compared": compared,
        "stopped_at_ties": ties,
        "mismatches": mismatches,
        "max_abs_diff": max_diff,
        "tolerance": tolerance,
        "passed": mismatches == 0 and compared > 0 and max_diff <= tolerance,
    }
