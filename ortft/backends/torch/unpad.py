"""``backend.unpad``: a transformer's per-position layers train on the real tokens only.

A batch padded to its longest row is mostly padding when texts are short: 60% of the positions
in the short-text peer's batches (Rotten Tomatoes snippets, batch 16, ``benchmarks/peer.py``),
29% in the DPO peer's (pairs of 22 tokens on average, ``peer_dpo.py``). Linear
layers (GPT-2's ``Conv1D`` too), the BERT family's feed-forward (``*Intermediate`` then
``*Output``: dense, activation, dropout, residual + LayerNorm) and a decoder's ``*MLP``
(GPT-2's, Llama's gated one) act on each position alone. So during a training forward they run
on the real positions gathered into one [tokens, width] matrix and scatter back. A real
position's values are unchanged, since attention masks the padded ones out as keys (and a
decoder's causal mask hides right padding anyway). A padded position holds zeros instead of
values that nothing reads. Attention itself still runs at [batch, heads, length, length], as
do the embeddings and norms between the blocks.

What is patched (``install``): a layer's whole ``feed_forward_chunk`` where it has one (BERT,
RoBERTa, ELECTRA...: the 4 x width activations between its two blocks are never scattered),
other ``*Output`` and ``*MLP`` blocks, then single Linear layers (q, k, v; DistilBERT's and
ALBERT's; GPT-2's fused ``c_attn``). A gather of a tensor the same forward scattered, or
gathered last, is served from memory (``Unpadder.gather``): q, k and v share one input, and
each block's residual is the output of the block before, so a BERT layer gathers once and
scatters five times. A GPT-2 layer gathers three times (before ``c_attn``, ``attn.c_proj``
and the MLP: a LayerNorm or attention stands between them) and scatters three times.

Where it applies (``plan``; ``auto`` picks it there, ``true`` elsewhere is an error):
- the torch backend, eager (a compiled forward would see a new gather length every batch), and
  the ort backend, traced (``in_graph``): the positions are ops of ORTModule's exported graph
  (NonZero of the mask, Gather, a Gather times the mask to scatter), so one export serves every
  batch, and ORT's CPU kernels, which lack its CUDA-only PaddingElimination, skip the padding.
- ``auto``: on a CPU. On a GPU no gain was measured (``CUDA_AUTO``); ``true`` unpads there too.
- training forwards only. Eval, predict and export run the model as it is (``arm`` is off
  outside ``module.training``). A backward that recomputes (gradient checkpointing) finds the
  same positions, because they stay set until the next forward; the memory of gathers is off
  then, so a recompute never gets the first forward's tensors.
- the model types in ``MODEL_TYPES``, encoders and decoders whose per-position blocks are
  known. DeBERTa-v2 is left out: it puts Linear layers on relative-position tables of shape
  [1, 2k, width], which a batch of one row at length 2k would take for hidden states.
- tasks that read no padded position (``traits.PadsUnread``): classification from the first
  token, token labels that are -100 at padding, masked-LM, pooled sentence embeddings, a
  decoder's next-token loss and preference log-probs (labels -100 at padding). Question
  answering is left out, because its start/end logits over padded positions enter the softmax.

The parameters and their names are untouched. The patch is a per-instance ``forward`` (or
``feed_forward_chunk``), so checkpoints, ``final/`` and DDP see the model as it was, and a
deep copy rebinds it to the copy.
"""

from __future__ import annotations

import re
import types
from typing import Any

import torch
from torch import nn
from transformers.pytorch_utils import Conv1D

from ortft.backends.torch.fusions import TanhGelu
from ortft.core.errors import InputError
from ortft.tasks import traits

# model types whose per-position blocks are checked equal to the padded forward
# (tests/test_unpad.py: losses and gradients on tiny models of each)
ENCODERS = {
    "bert",
    "roberta",
    "xlm-roberta",
    "camembert",
    "electra",
    "distilbert",
    "albert",
    "mpnet",
}
DECODERS = {"gpt2", "llama", "qwen2"}
MODEL_TYPES = frozenset(ENCODERS | DECODERS)
# a block of these layers only is applied per position as a whole (BertOutput: dense, dropout,
# LayerNorm of it plus the residual input; GPT2MLP: c_fc, GELU, c_proj, dropout)
BLOCK_NAME = re.compile(r"(Intermediate|Output|MLP)$")
LINEAR = (nn.Linear, Conv1D)  # patched alone where no block holds them
PER_POSITION = (*LINEAR, nn.LayerNorm, nn.Dropout, nn.GELU, nn.ReLU, nn.Tanh, nn.SiLU, TanhGelu)
# gathered positions come in multiples of this (``Unpadder.arm``): a Linear of MiniLM's width in
# bf16 on the Intel Xeon with AMX took 9.8 ms a forward + backward at a matrix height it had
# not seen and 3.1 ms at one it had (oneDNN's kernel for the shape is built once), 3.6 ms at
# heights rounded up to 64 (60 heights in 300-900, tokens x 384 -> 1536)
ROUND = 64
# why auto leaves it off on a GPU: no gain measured there (BERT-base, bf16, batch 64 at its
# longest row, on an NVIDIA H200 with torch 2.11: unpadded / padded samples/s 0.92-1.17x,
# median 1.005x over 5 alternating pairs, gpu-torch-h200-2026-12-04-unpad*.json), and each
# batch's gather costs a host sync (nonzero)
CUDA_AUTO = "auto: off on a GPU (no gain measured on an H200); backend.unpad=true turns it on"


class Unpadder:
    """The real positions of the current training batch, what the patched modules gathered
    and scattered in this forward, and ``calls``: gathered forwards so far (a test's proof)."""

    def __init__(self, in_graph: bool = False) -> None:
        # in_graph: traced into ORTModule's graph (``arm_in_graph``), not run eagerly
        self.in_graph = in_graph
        self.idx: torch.Tensor | None = None  # flat indices of the real positions
        self.skipped: torch.Tensor | None = None  # flat indices of the others (zeros, scatter)
        self.inverse: torch.Tensor | None = None  # in_graph: each position's packed row
        self.keep: torch.Tensor | None = None  # in_graph: [positions, 1], whether it is real
        self.shape: tuple[int, int] | None = None  # (batch, length) of the padded batch
        self.calls = 0
        self.patched: list[str] = []
        self.memo = True  # off under gradient checkpointing (``arm``)
        # this forward's scattered outputs -> (their version, the unpadded tensor they came
        # from), and the last gathered input: a later gather of either is served from here.
        # MiniLM's q, k and v read one input and each block's residual is the block before's
        # output, so this saves 3 of the 5 gathers of a layer (and their backward's index_add).
        self._sources: dict[int, tuple[torch.Tensor, int, torch.Tensor]] = {}
        self._last: tuple[torch.Tensor, int, torch.Tensor] | None = None

    def arm(self, module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        """The encoder's forward pre-hook: the positions to gather, from its attention mask,
        in a training forward of a batch that has padding; none otherwise."""
        self.idx, self.skipped, self.inverse, self.shape, self._last = (None,) * 5
        self._sources.clear()
        mask = kwargs.get("attention_mask")
        if mask is None or not module.training or mask.dim() not in (2, 4):
            return
        if mask.dim() == 4:  # a mask of its own (preference's shared prefix): its real tokens
            mask = real_positions(mask)
        # a checkpointed layer's recompute would be handed this forward's tensors: no memo
        self.memo = not any(getattr(m, "gradient_checkpointing", False) for m in module.modules())
        if self.in_graph:
            self.arm_in_graph(mask)
            return
        if not torch.is_grad_enabled():
            return
        flat = mask.reshape(-1)
        if bool(flat.all()):  # no padding: nothing to skip
            return
        real = flat.nonzero().squeeze(1)
        # a few padded positions ride along, so that the gathered count is a multiple of
        # ROUND: oneDNN builds a kernel for each new matrix shape it sees, and a count new
        # every batch cost more than the skipped padding saved (ROUND's comment)
        extra = min(-len(real) % ROUND, len(flat) - len(real))
        pads = (flat == 0).nonzero().squeeze(1)
        self.idx = torch.cat([real, pads[:extra]]) if extra else real
        self.skipped = pads[extra:]
        self.shape = (mask.shape[0], mask.shape[1])

    def arm_in_graph(self, mask: torch.Tensor) -> None:
        """The positions as ops of the traced graph, with no Python branch on the mask's values:
        ORTModule exports the forward once and runs that graph for every later batch, whatever
        its padding. No rounding to ``ROUND`` either (a count is a value of the graph, and ORT's
        MLAS builds no kernel per matrix height). The scatter is a Gather too, times the
        mask (``scatter``): a zero row built in the graph (ConstantOfShape, concatenated) made
        ORT 1.19's gradient build fail on a duplicate name."""
        real = mask.reshape(-1) != 0
        self.idx = real.nonzero().squeeze(1)
        # a real position's row in the packed matrix; a padded one takes row 0, then zeroed
        rank = real.long().cumsum(0) - 1
        self.inverse = torch.where(real, rank, torch.zeros_like(rank))
        self.keep = real.unsqueeze(1)
        self.shape = (mask.shape[0], mask.shape[1])

    def gather(self, t: Any, idx: torch.Tensor) -> Any:
        """[batch, length, width] -> [positions, width]; anything else as it is."""
        b, n = self.shape or (0, 0)
        if not (isinstance(t, torch.Tensor) and t.dim() == 3 and tuple(t.shape[:2]) == (b, n)):
            return t
        source = self._sources.get(id(t))
        if self.memo and source is not None and source[0] is t and source[1] == t._version:
            return source[2]
        last = self._last
        if self.memo and last is not None and last[0] is t and last[1] == t._version:
            return last[2]
        g = t.reshape(-1, t.shape[-1]).index_select(0, idx)
        if self.memo:
            self._last = (t, t._version, g)
        return g

    def scatter(self, out: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """[positions, width] -> [batch, length, width], zeros at the padded positions: nothing
        downstream reads them (module docstring)."""
        b, n = self.shape or (0, 0)
        if self.inverse is not None and self.keep is not None:  # in_graph: Gather, then Mul
            rows = out.index_select(0, self.inverse) * self.keep.to(out.dtype)
            full = rows.view(b, n, out.shape[-1])
        else:
            # written once: the positions skipped are zeroed and the others copied into an
            # empty tensor, not copied over a zeroed one (a fill, a clone and a copy before)
            full = out.new_empty(b * n, out.shape[-1])
            if self.skipped is not None:
                full.index_fill_(0, self.skipped, 0)
            full = full.index_copy_(0, idx, out).view(b, n, out.shape[-1])
        if self.memo:
            self._sources[id(full)] = (full, full._version, out)
        return full

    def run(self, fn: Any, module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> Any:
        """``fn(module, *args, **kwargs)`` on the gathered positions, scattered back."""
        idx = self.idx
        if idx is None:
            return fn(module, *args, **kwargs)
        gathered = [self.gather(a, idx) for a in args]
        if all(g is a for g, a in zip(gathered, args, strict=True)):
            return fn(module, *args, **kwargs)  # not a [batch, length, width] input
        self.calls += 1
        return self.scatter(fn(module, *gathered, **kwargs), idx)


def real_positions(mask: torch.Tensor) -> torch.Tensor:
    """[batch, length] booleans: the real positions of a 4D attention mask (booleans, or
    added to the scores: 0 where allowed), the keys some query may attend to. A real token may
    attend to itself, and no query to padding (transformers' masks and ``task.share_prefix``'s
    alike)."""
    allowed = mask if mask.dtype == torch.bool else mask == 0
    return allowed[:, 0].any(dim=1)


def _unpadded_forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """A per-position module's forward on the gathered real positions, scattered back."""
    state: Unpadder = self._ortft_unpadder  # type: ignore[assignment]
    return state.run(type(self).forward, self, args, kwargs)


def _unpadded_chunk(self: nn.Module, attention_output: torch.Tensor) -> torch.Tensor:
    """A BERT-style layer's ``feed_forward_chunk`` (intermediate, then output with its
    residual) on the gathered positions: the [positions, 4 x width] between them is never
    scattered. One argument, as transformers' ``apply_chunking_to_forward`` counts them."""
    state: Unpadder = self._ortft_unpadder  # type: ignore[assignment]
    fn = type(self).feed_forward_chunk  # type: ignore[attr-defined]
    return state.run(fn, self, (attention_output,), {})


def _is_block(module: nn.Module) -> bool:
    children = list(module.modules())[1:]
    return (
        bool(BLOCK_NAME.search(type(module).__name__))
        and bool(children)
        and all(
            isinstance(m, PER_POSITION) or type(m).__module__.endswith(".activations")
            for m in children
        )
    )


def install(encoder: nn.Module, in_graph: bool = False) -> Unpadder:
    """Patch ``encoder``'s per-position parts and hook its forward to arm them; the encoder is
    a model's ``base_model`` (a BertModel, a GPT2Model...). A layer's feed-forward chunk goes
    whole where the layer has one; then ``*Intermediate`` / ``*Output`` / ``*MLP`` blocks; then
    single Linear (or Conv1D) layers (LoRA's included). ``in_graph``: for ORTModule, which
    traces the forward (``arm_in_graph``)."""
    state = Unpadder(in_graph)
    done: list[str] = []  # what is patched
    skip: list[str] = []  # and what is inside a patched part
    for name, module in encoder.named_modules():
        if any(name == d or name.startswith(d + ".") for d in skip):
            continue  # inside a patched part
        if _has_chunk(module):
            module.feed_forward_chunk = types.MethodType(_unpadded_chunk, module)  # type: ignore[assignment]
            skip += [f"{name}.intermediate", f"{name}.output"]
            done.append(f"{name}.feed_forward_chunk")
        elif _is_block(module) or isinstance(module, LINEAR):
            module.forward = types.MethodType(_unpadded_forward, module)  # type: ignore[method-assign]
            done.append(name)
            skip.append(name)
        else:
            continue
        module._ortft_unpadder = state  # type: ignore[assignment]
    state.patched = done
    encoder.register_forward_pre_hook(state.arm, with_kwargs=True)
    return state


def _has_chunk(module: nn.Module) -> bool:
    """A BERT-style layer: ``feed_forward_chunk`` over ``intermediate`` and ``output`` blocks."""
    children = dict(module.named_children())
    return callable(getattr(type(module), "feed_forward_chunk", None)) and all(
        k in children and _is_block(children[k]) for k in ("intermediate", "output")
    )


def plan(
    model: nn.Module, task: Any, setting: Any, compiled: bool, device: str = "cpu"
) -> tuple[bool, str]:
    """(whether to unpad this run, why): ``setting`` is backend.unpad (true, false, auto);
    ``true`` where it cannot apply is an InputError naming the reason. ``auto`` unpads on a
    CPU only (``CUDA_AUTO``)."""
    if setting is False:
        return False, "backend.unpad=false"
    kind = getattr(getattr(_inner(model), "config", None), "model_type", None)
    if compiled:
        why = "the forward is compiled (a new gather length every batch would recompile)"
    elif not traits.pads_unread(task):
        why = f"task {task.name} reads padded positions (or is not a text task)"
    elif kind not in MODEL_TYPES:
        why = f"model type {kind} is not one of {', '.join(sorted(MODEL_TYPES))}"
    elif setting == "auto" and device != "cpu":
        return False, CUDA_AUTO
    else:
        return True, f"{kind}'s per-position layers run on the real tokens only"
    if setting is True:
        raise InputError(f"backend.unpad=true cannot apply: {why}")
    return False, why


def encoder_of(model: nn.Module) -> nn.Module:
    """The transformer under a task head (and under a PEFT wrapper)."""
    return _inner(model).base_model


def _inner(model: nn.Module) -> Any:
    """The transformers model under a PEFT wrapper, or the model itself."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model
