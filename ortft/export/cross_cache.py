"""An encoder-decoder's decoder with both caches, as one graph in Optimum's merged layout
(``decoder_model_merged.onnx``, what transformers.js's ``text2text-generation`` and
``automatic-speech-recognition`` pipelines open), shared by seq2seq and speech.

Inputs: ``input_ids`` [batch, target], ``encoder_hidden_states``, (``encoder_attention_mask``),
``past_key_values.<layer>.decoder.key|value`` (self-attention, [batch, heads, past, head_dim]),
``past_key_values.<layer>.encoder.key|value`` (cross-attention, [batch, heads, source,
head_dim]) and ``use_cache_branch`` (bool [1]). Outputs: ``logits`` and the same caches named
``present.*``.

The graph is an ``If`` on ``use_cache_branch`` over two traced graphs of the same model:
- false, the first step: the cross-attention keys and values are computed from
  ``encoder_hidden_states`` and returned as ``present.<layer>.encoder.*``; the self-attention
  past is fed empty.
- true, every later step: they are read from ``past_key_values.<layer>.encoder.*`` (no
  projection of the encoder's states); ``present.*.encoder.*`` are empty, as in Optimum's
  merged decoders: a client keeps the first step's (transformers.js does).
Two traces, because the model picks "compute" or "reuse" with a Python branch (its cache's
``is_updated``), which tracing fixes. Each trace's weights are the same tensors: the merge keeps
one copy of every identical initializer, so the merged file is one decoder's size.

Axis names are Optimum's: transformers.js builds the first step's empty past from the graph's
input shapes, resolving ``batch_size`` and reading every other symbolic axis as 0.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ortft.core.errors import InputError

# the files of an encoder-decoder's export (Optimum's names), and before format_version 3
ENCODER, DECODER = "encoder_model.onnx", "decoder_model_merged.onnx"
OLD_ENCODER, OLD_DECODER = "encoder.onnx", "decoder.onnx"  # format_version 2: no cross cache
USE_CACHE = "use_cache_branch"
BATCH = "batch_size"
EXTERNAL_OVER = 1_800_000_000  # bytes of weights above which the merged graph's go to a .data file


def cache_names(n_layers: int, prefix: str = "past_key_values", cross: bool = True) -> list[str]:
    """Per layer: the self-attention key and value, then (``cross``) the cross-attention's."""
    sides = ("decoder", "encoder") if cross else ("decoder",)
    return [
        f"{prefix}.{i}.{s}.{kv}" for i in range(n_layers) for s in sides for kv in ("key", "value")
    ]


def cache(past: tuple[Any, ...], n_layers: int) -> Any:
    """The model's ``EncoderDecoderCache`` of flat tensors: 2 per layer (the self-attention's;
    the cross-attention cache empty, so the model computes it) or 4 (both: read)."""
    from transformers import DynamicCache, EncoderDecoderCache

    per = len(past) // n_layers
    own = DynamicCache([(past[per * i], past[per * i + 1]) for i in range(n_layers)])
    if per == 2:
        return EncoderDecoderCache(own, DynamicCache())
    cross = DynamicCache([(past[per * i + 2], past[per * i + 3]) for i in range(n_layers)])
    return EncoderDecoderCache(own, cross)


def presents(cache: Any, cross: bool) -> list[Any]:
    """The flat tensors of ``cache`` in ``cache_names`` order (``cross``: with the cross's)."""
    out = []
    for i, layer in enumerate(cache.self_attention_cache.layers):
        out += [layer.keys, layer.values]
        if cross:
            c = cache.cross_attention_cache.layers[i]
            out += [c.keys, c.values]
    return out


# --------------------------------------------------------------------------- export and merge


def export(
    make: Callable[[bool], Any],
    head: dict[str, Any],
    self_shape: tuple[int, int],
    n_layers: int,
    path: Path,
    opset: int,
) -> tuple[list[str], list[str]]:
    """Trace ``make(False)`` (the first step) and ``make(True)`` (the later ones) and merge them
    into ``path``; (inputs, outputs). ``head``: the first inputs by name, in order (``input_ids``
    [batch, 2], then the encoder's states and mask); each module takes them and then the flat
    past (``cache``). ``self_shape``: the self-attention's (heads, head_dim). The first step is
    traced on 3 random past positions, the later one on the first's presents."""
    import tempfile

    import torch

    from ortft.export import onnx_tools as tools

    names, values = list(head), list(head.values())
    batch = len(values[0])
    gen = torch.Generator().manual_seed(0)
    heads, dim = self_shape
    own = [torch.randn(batch, heads, 3, dim, generator=gen) for _ in range(2 * n_layers)]
    first_in = names + cache_names(n_layers, cross=False)
    first_out = ["logits", *cache_names(n_layers, "present")]
    later_in = names + cache_names(n_layers)
    later_out = ["logits", *cache_names(n_layers, "present", cross=False)]
    axes = _axes(later_in + first_out)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        first, later = Path(tmp) / "first.onnx", Path(tmp) / "later.onnx"
        tools.torch_export(make(False), (*values, *own), first, opset, first_in, first_out, axes)
        with torch.no_grad():
            past = make(False)(*values, *own)[1:]  # 5 self positions, the cross keys and values
        tools.torch_export(make(True), (*values, *past), later, opset, later_in, later_out, axes)
        merge(first, later, path, later_in)
    return [*later_in, USE_CACHE], first_out


def _axes(names: list[str]) -> dict[str, dict[int, str]]:
    """Optimum's symbolic axes for every input and output name."""
    out: dict[str, dict[int, str]] = {}
    for name in names:
        if name in ("input_ids", "logits"):
            out[name] = {0: BATCH, 1: "decoder_sequence_length"}
        elif name in ("encoder_hidden_states", "encoder_attention_mask"):
            out[name] = {0: BATCH, 1: "encoder_sequence_length"}
        elif name.endswith(("encoder.key", "encoder.value")):
            out[name] = {0: BATCH, 2: "encoder_sequence_length_out"}
        elif name.startswith("past_key_values"):
            out[name] = {0: BATCH, 2: "past_decoder_sequence_length"}
        else:  # present.*.decoder.*
            out[name] = {0: BATCH, 2: "past_decoder_sequence_length + 1"}
    return out


def _tensor_key(t: Any) -> tuple[Any, ...]:
    from onnx import numpy_helper

    data = numpy_helper.to_array(t)
    return (t.data_type, tuple(t.dims), hashlib.sha256(data.tobytes()).hexdigest())


def _branch(
    model: Any, prefix: str, outer: set[str], shared: dict[tuple[Any, ...], Any]
) -> tuple[list[Any], dict[str, Any]]:
    """``model``'s graph as an If branch: its own names prefixed (the outer inputs kept), its
    initializers moved out to ``shared`` (one per identical tensor); (nodes, {output: value})."""
    import onnx

    g = model.graph
    rename: dict[str, str] = {}
    for t in g.initializer:
        key = _tensor_key(t)
        if key not in shared:
            t.name, old = prefix + t.name, t.name
            shared[key] = t
            rename[old] = t.name
        else:
            rename[t.name] = shared[key].name

    def name(n: str) -> str:
        if not n or n in outer:
            return n
        return rename.get(n, prefix + n)

    nodes, outputs = [], {}
    for node in g.node:
        if any(
            a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
            for a in node.attribute
        ):
            raise ValueError(f"{node.op_type} node with a subgraph: cannot merge")
        node.input[:] = [name(n) for n in node.input]
        node.output[:] = [name(n) for n in node.output]
        node.name = prefix + node.name
        nodes.append(node)
    for out in g.output:
        inner = name(out.name)
        if inner in outer or inner in rename.values():  # a branch output must be a node's
            nodes.append(onnx.helper.make_node("Identity", [inner], [prefix + out.name + "/id"]))
            inner = prefix + out.name + "/id"
        vi = onnx.ValueInfoProto()
        vi.CopyFrom(out)
        vi.name = inner
        outputs[out.name] = vi
    return nodes, outputs


def merge(first: Path, later: Path, path: Path, inputs: list[str]) -> None:
    """Write ``path``: ``If(use_cache_branch, later, first)`` over the two traced graphs, the
    later one's missing ``present.*.encoder.*`` outputs empty tensors."""
    import onnx
    from onnx import TensorProto, helper

    a, b = onnx.load(str(first)), onnx.load(str(later))
    declared = {i.name: i for m in (b, a) for i in m.graph.input}
    outer = set(inputs)
    shared: dict[tuple[Any, ...], Any] = {}
    first_nodes, first_outs = _branch(a, "first/", outer, shared)
    later_nodes, later_outs = _branch(b, "later/", outer, shared)
    ordered = []
    for out in a.graph.output:  # the later branch's outputs in the first's order
        if out.name in later_outs:
            ordered.append(later_outs[out.name])
            continue
        # an empty tensor, as Optimum's merged decoders give: a copy of the past would move
        # every layer's cross-attention keys and values at every step for no reader
        kind = declared[out.name.replace("present", "past_key_values", 1)].type.tensor_type
        empty = helper.make_tensor("empty", kind.elem_type, [0, 0, 0, 0], [])
        later_nodes.append(helper.make_node("Constant", [], ["later/" + out.name], value=empty))
        ordered.append(helper.make_tensor_value_info("later/" + out.name, kind.elem_type, None))
    then = helper.make_graph(later_nodes, "with_past", [], ordered)
    other = helper.make_graph(
        first_nodes, "first_step", [], [first_outs[o.name] for o in a.graph.output]
    )
    names = [o.name for o in a.graph.output]
    node = helper.make_node("If", [USE_CACHE], names, then_branch=then, else_branch=other)
    flag = helper.make_tensor_value_info(USE_CACHE, TensorProto.BOOL, [1])
    graph = helper.make_graph(
        [node],
        "decoder_model_merged",
        [declared[n] for n in inputs if n in declared] + [flag],
        list(a.graph.output),
        initializer=list(shared.values()),
    )
    merged = helper.make_model(graph, opset_imports=a.opset_import, producer_name="ortft")
    merged.ir_version = a.ir_version
    weights = sum(t.ByteSize() for t in shared.values())
    if weights > EXTERNAL_OVER:
        onnx.save(merged, str(path), save_as_external_data=True, location=path.name + ".data")
    else:
        onnx.save(merged, str(path))
    onnx.checker.check_model(str(path))


# --------------------------------------------------------------------------- running it


class Past:
    """The merged decoder's caches as a runner feeds them: empty at the first step (the graph
    computes the cross-attention's keys and values), then each step's presents, the cross ones
    kept from the first step."""

    def __init__(self, session: Any, batch: int):
        from ortft.export import parity

        self.past = parity.empty_past(session, batch)
        self.outputs = [o.name for o in session.get_outputs()]
        self.started = False

    def feeds(self) -> dict[str, np.ndarray]:
        return {**self.past, USE_CACHE: np.array([self.started])}

    def update(self, outputs: list[np.ndarray]) -> None:
        for name, value in zip(self.outputs, outputs, strict=True):
            if name.startswith("present.") and not (self.started and ".encoder." in name):
                self.past[name.replace("present", "past_key_values", 1)] = value
        self.started = True

    def reorder(self, rows: np.ndarray) -> None:
        self.past = {k: v[rows] for k, v in self.past.items()}


class Steps:
    """``generation.Steps`` of a merged decoder: ``decode(tokens, *states, past)`` gives one
    step's logits; ``states`` are the encoder's per-input arrays (its hidden states, a mask),
    repeated for each input's beams at the first step, as ``generate`` does."""

    def __init__(self, session: Any, decode: Callable[..., np.ndarray], *states: np.ndarray):
        self.session, self.decode, self.states = session, decode, states
        self.past: Past | None = None

    def __call__(self, tokens: np.ndarray) -> np.ndarray:
        if self.past is None:
            beams = len(tokens) // len(self.states[0])
            self.states = tuple(np.repeat(x, beams, axis=0) for x in self.states)
            self.past = Past(self.session, len(tokens))
        return self.decode(tokens.astype(np.int64), *self.states, self.past)[:, -1]

    def reorder(self, rows: np.ndarray) -> None:
        if self.past is not None:
            self.past.reorder(rows)


def refuse_old(folder: Path) -> None:
    """An InputError for an export of an older ortft (its decoder.onnx recomputes the
    cross-attention at each step): re-export it."""
    if (folder / OLD_DECODER).exists() and not (folder / DECODER).exists():
        raise InputError(
            f"{folder}: an export of an older ortft ({OLD_DECODER}, export.json format_version "
            f"2); re-export it with `ortft export RUN` ({ENCODER} + {DECODER})"
        )
