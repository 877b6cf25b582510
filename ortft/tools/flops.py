"""Matrix-multiply FLOPs of a training step, from the shapes it ran (the MFU numerator), and
the machine's measured matmul peak (``measure_peak_flops``, the denominator).

A forward pass over ``rows`` rows of ``length`` positions costs

- ``2 × per_token × rows × length``: every weight matrix applied at every position (attention's
  Q/K/V/output projections, the MLP, an LM head, tied to the embedding or not);
- ``2 × per_row × rows``: the weights applied once per row (a classifier's pooler and head);
- ``4 × layers × width × rows × length²``: attention's scores (Q·Kᵀ) and weighted values (·V),
  counted in full for causal models too (PaLM's MFU convention);

and forward + backward is taken as 3 × the forward (the backward computes two products per
forward one: the input's gradient and the weight's): the field's ``6 × N × tokens`` (Kaplan et
al. 2020, "Scaling Laws for Neural Language Models", §2.1; PaLM's MFU, Chowdhery et al. 2022,
appendix B). With LoRA (``frozen``) the base's weights get no gradient: their backward is the
input's gradient alone, ``2 × per_token × tokens`` forward + the same backward, ``4 × N ×
tokens`` in all; the per-row head (trained in full) and attention's scores keep their 3 ×, and
the adapters' own products (rank × (in + out) per adapted weight, under 1% of the base's at rank
8 on MiniLM's Q and V) are left out. Embedding tables are lookups, not matmuls,
and are left out, as are biases, LayerNorm, softmax and activations (no matmuls). The former
``6 × parameters × batch × max_length`` counted the embeddings (1.7M of bert-cls's 4.9M
parameters; 3.2M are matmul weights) and padding that ``data.padding: longest`` no longer
runs: it read 109.8% for torch.

"Useful" FLOPs are those of the real tokens only: a row of ``l`` real tokens costs what a
batch of one row cut to ``l`` would (``Σ l`` and ``Σ l²`` over the rows); "hardware" FLOPs are
those of the padded shapes that ran.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# sequence-classification heads that read one position per row (BERT's pooler + classifier,
# RoBERTa's classifier.dense/out_proj, DistilBERT's pre_classifier); GPT-2's `score` is applied
# at every position (the last one is picked after) and stays per-token
PER_ROW_MODULES = {"pooler", "classifier", "pre_classifier"}


@dataclass(frozen=True)
class FlopModel:
    per_token: int  # matmul weights applied at every position
    per_row: int  # matmul weights applied once per row
    layers: int  # attention layers
    width: int  # attention heads × head size
    frozen: bool = False  # LoRA: the per-position weights get no gradient (backward = dX only)

    @property
    def _weights_x(self) -> float:
        """Training FLOPs of the per-position weights as a multiple of their forward."""
        return 2.0 if self.frozen else 3.0

    def forward(self, rows: int, length: int) -> float:
        """Forward FLOPs of ``rows`` rows padded to ``length``."""
        return (
            2.0 * self.per_token * rows * length
            + 2.0 * self.per_row * rows
            + 4.0 * self.layers * self.width * rows * length**2
        )

    def hardware(self, rows_per_micro: int, batch_lengths: list[int]) -> float:
        """Training FLOPs of a step whose micro-batches ran at ``batch_lengths`` (padded)."""
        r = rows_per_micro
        return sum(self.useful(r, r * n, r * n * n) for n in batch_lengths)

    def useful(self, rows: int, tokens: int, tokens_sq: int) -> float:
        """Training FLOPs the real tokens need: ``tokens`` = Σ l, ``tokens_sq`` = Σ l² over the
        step's ``rows`` rows (each row cut to its own length)."""
        return (
            self._weights_x * 2.0 * self.per_token * tokens
            + 3.0 * 2.0 * self.per_row * rows
            + 3.0 * 4.0 * self.layers * self.width * tokens_sq
        )

    def as_dict(self) -> dict[str, int | bool]:
        return asdict(self)


def count(model: Any, config: Any, task: str) -> FlopModel | None:
    """The FLOP model of ``model`` (any ``nn.Module``; its weights may be on the meta device).
    None for encoder-decoder models: their decoder's lengths are not the input's."""
    import torch
    from transformers.pytorch_utils import Conv1D

    if getattr(config, "is_encoder_decoder", False):
        return None
    per_token = per_row = 0
    for name, module in model.named_modules():
        if not isinstance(module, (torch.nn.Linear, Conv1D)):
            continue  # nn.Embedding is a lookup; a tied LM head is an nn.Linear and counts
        n = module.weight.numel()
        if task == "sequence-classification" and PER_ROW_MODULES & set(name.split(".")):
            per_row += n
        else:
            per_token += n
    heads = config.num_attention_heads
    head_size = getattr(config, "head_dim", None) or config.hidden_size // heads
    return FlopModel(per_token, per_row, config.num_hidden_layers, heads * head_size)


def from_saved(
    model_dir: Path, auto_class: str, task: str, frozen: bool = False
) -> FlopModel | None:
    """The FLOP model of the model saved in ``model_dir`` (its config.json), built on the meta
    device: no weights are allocated or read; ``frozen``: trained with a LoRA adapter."""
    fm = _from_saved(model_dir, auto_class, task)
    return dataclasses.replace(fm, frozen=True) if fm is not None and frozen else fm


def _from_saved(model_dir: Path, auto_class: str, task: str) -> FlopModel | None:
    import torch
    import transformers

    config = transformers.AutoConfig.from_pretrained(model_dir)
    auto = getattr(transformers, auto_class)
    try:
        # import the model class outside the meta context: importing transformers' modules
        # under it fails (they build tensors at import time)
        model_class = auto._model_mapping[type(config)]
    except (AttributeError, KeyError):
        return count(auto.from_config(config), config, task)  # on the CPU, a few seconds
    with torch.device("meta"):
        model = model_class(config)
    return count(model, config, task)


def _best_seconds(run: Any, reps: int, sync: Any = None) -> float:
    best = float("inf")
    for _ in range(4):
        if sync:
            sync()
        t0 = time.perf_counter()
        for _ in range(reps):
            run()
        if sync:
            sync()
        best = min(best, time.perf_counter() - t0)
    return best


def _ort_matmul_rate(n: int, reps: int, threads: int) -> float:
    """FLOP/s of ONNX Runtime's CPU MatMul (MLAS): the GEMM that ORT's backends run."""
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper

    io = [helper.make_tensor_value_info(x, TensorProto.FLOAT, [n, n]) for x in "ABC"]
    graph = helper.make_graph([helper.make_node("MatMul", ["A", "B"], ["C"])], "mm", io[:2], io[2:])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    sess = ort.InferenceSession(model.SerializeToString(), options, ["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feeds = {x: rng.standard_normal((n, n), dtype=np.float32) for x in "AB"}
    return 2 * n**3 * reps / _best_seconds(lambda: sess.run(None, feeds), reps)


def measure_peak_flops(device: str, threads: int) -> dict[str, Any]:
    """The best fp32 matrix-multiply rate this machine reaches now (the MFU denominator).

    On the CPU, the better of PyTorch's GEMM (MKL) and ONNX Runtime's (MLAS): the backends run
    either, and they differ. On the 2-core AMD EPYC (AVX-512) VM, 2048² on 2 threads: torch 224
    GFLOP/s, ORT 471 (MKL takes its AVX2 path on AMD CPUs); a peak from torch alone put ORT's
    MFU at 128%."""
    import torch

    torch.set_num_threads(threads)
    n, reps = (2048, 8) if device == "cpu" else (8192, 20)
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    sync = torch.cuda.synchronize if device == "cuda" else None
    rates = {"torch": 2 * n**3 * reps / _best_seconds(lambda: a @ b, reps, sync)}
    if device == "cpu":
        rates["onnxruntime"] = _ort_matmul_rate(n, reps, threads)
    libs = " and ".join(f"{k} {v / 1e9:.0f} GFLOP/s" for k, v in rates.items())
    return {
        "flops": max(rates.values()),
        "by_library": rates,
        "device": device,
        "threads": threads,
        "how": f"best of 4 × {reps} fp32 {n}×{n} matmuls on {threads} thread(s) ({libs}; the "
        "better one), measured just before the runs (an achievable peak, not the datasheet one)",
    }
