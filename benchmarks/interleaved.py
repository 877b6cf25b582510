"""ORT vs PyTorch in one process, one step each in turn: a drift-free A/B for the CPU levers.

``ortft bench`` runs each backend in its own process (A B A B ...), which is what users run, but
a shared 2-core VM drifts by 20-30% between runs half a minute apart. Here the contenders live
in one process and take turns step by step, so every step pair sees the same machine:

- ``torch``: the bench baseline (sdpa attention, fused AdamW);
- ``ort``: ORTModule with ortft's defaults (backend.pytorch_kernels=auto, spinning off);
- ``ort-plain``: ORTModule with ORT's own kernels (backend.pytorch_kernels=[]).

Run (GOMP_SPINCOUNT is read when torch is imported; the ort backend sets 1000):

    GOMP_SPINCOUNT=1000 python benchmarks/interleaved.py bert --steps 40
    GOMP_SPINCOUNT=1000 python benchmarks/interleaved.py gpt2 --steps 40

Prints, per contender, the median step time (forward + backward + optimizer step) and the
median of the per-round ratios to torch; the loss after the last step shows they trained alike.
Same model sizes as ``recipes/bench/`` (random tokens: the step cost does not depend on them).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch


def build(kind: str, attn: str) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    from transformers import BertConfig, BertForSequenceClassification, GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    if kind == "bert":
        config = BertConfig(
            vocab_size=8000, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
            intermediate_size=1024, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
            num_labels=3, attn_implementation=attn,
        )  # fmt: skip
        model = BertForSequenceClassification(config)
        ids = torch.randint(0, 8000, (16, 128))
        batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
                 "labels": torch.randint(0, 3, (16,))}  # fmt: skip
    else:
        config = GPT2Config(
            vocab_size=4000, n_embd=256, n_layer=4, n_head=4, n_positions=128, resid_pdrop=0.0,
            embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False, attn_implementation=attn,
        )  # fmt: skip
        model = GPT2LMHeadModel(config)
        ids = torch.randint(0, 4000, (8, 128))
        batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
    return model.train(), batch


def ort(kind: str, kernels: tuple[str, ...]) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    from onnxruntime.training.ortmodule import ORTModule

    from ortft.backends.ortmodule import kernels as ort_kernels
    from ortft.backends.ortmodule import wrapper as ort_backend
    from ortft.backends.torch import fusions

    model, batch = build(kind, "eager")
    ort_backend._install_session_tweaks()  # spinning off (ortft's default)
    ort_kernels.install(kernels, model)
    if "gelu" in kernels:
        fusions.fuse_tanh_gelu(model)
    wrapped = ORTModule(model)
    wrapped(**batch)[0].backward()  # export now, under this kernel setting
    wrapped.zero_grad(set_to_none=True)
    return wrapped, batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", choices=["bert", "gpt2"])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    os.environ["ORTMODULE_FALLBACK_POLICY"] = "FALLBACK_DISABLE"
    torch.set_num_threads(os.cpu_count() or 1)
    from ortft.backends.ortmodule import kernels as ort_kernels

    contenders = {
        "torch": build(args.model, "sdpa"),
        "ort": ort(args.model, ort_kernels.KERNELS),
        "ort-plain": ort(args.model, ()),
    }
    optimizers = {
        name: torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        for name, (model, _) in contenders.items()
    }
    times: dict[str, list[float]] = {name: [] for name in contenders}
    losses: dict[str, float] = {}
    for step in range(args.warmup + args.steps):
        for name, (model, batch) in contenders.items():
            t0 = time.perf_counter()
            loss = model(**batch)[0]
            loss.backward()
            optimizers[name].step()
            optimizers[name].zero_grad(set_to_none=True)
            elapsed = time.perf_counter() - t0
            losses[name] = float(loss)
            if step >= args.warmup:
                times[name].append(elapsed)
    base = times["torch"]
    print(f"{args.model}: {args.steps} rounds, GOMP_SPINCOUNT={os.environ.get('GOMP_SPINCOUNT')}")
    for name, values in times.items():
        ratio = statistics.median(b / v for b, v in zip(base, values, strict=True))
        print(
            f"  {name:10s} {statistics.median(values) * 1e3:7.1f} ms/step  "
            f"{ratio:.2f}x torch  loss {losses[name]:.5f}"
        )


if __name__ == "__main__":
    main()
