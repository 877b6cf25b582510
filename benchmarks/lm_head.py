"""A causal LM's head at the labelled positions only, against transformers' forward.

Run (``make bench-lm-head``; not in CI; a quiet machine):

    .venv-current/bin/python benchmarks/lm_head.py [--rounds 6] [--vocab 32000]

A loss that reads a few positions of a long sequence: a vision-language model's answers after
the image's tokens and the question, an instruction's response after its prompt. transformers'
forward projects every position onto the vocabulary and its loss then ignores the unlabelled
ones; ortft's training forward (``ortft/tasks/lm_head.py``: image-text-to-text, causal-lm,
instruction, and preference tuning's log-probs) runs the head at the labelled positions only.
This times the two on a Llama from the same input embeddings:

- ``full``: ``model(inputs_embeds=..., labels=...)``, transformers' ``ForCausalLMLoss``;
- ``labelled``: ``model.model(inputs_embeds=...)`` then ``next_token_loss`` at
  ``label_positions``, as the training forward runs them.

Defaults: LLaVA-1.5's sequence shape (``--masked 600``: its 576 image tokens and 24 of question
and template, then ``--labelled 4`` answer tokens a row) and its 32000-token vocabulary, on a
Llama of hidden 256 and 2 layers that 2 CPU cores can train, batch 4, fp32, a forward, backward
and fused AdamW step. The settings alternate: ``--rounds`` timed rounds of ``--steps`` steps
each after one untimed round; the median round's mean step is printed for each, full /
labelled (above 1: the head at the labelled positions is faster), and the logits each keeps for
the backward (arithmetic: rows x vocabulary x 4 bytes). The two losses are checked equal first
(both ways). ``--way full`` or ``--way labelled`` times that one alone and prints the process's
peak RSS (run each in its own process to compare memory).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time
from collections.abc import Callable

import peer_common as common  # benchmarks/: the script's folder is on sys.path
import torch

from ortft.tasks.lm_head import label_positions, next_token_loss


def model_and_batch(args: argparse.Namespace) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=4,
        intermediate_size=4 * args.hidden,
        max_position_embeddings=args.masked + args.labelled,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    length = args.masked + args.labelled
    embeds = torch.randn(args.batch, length, args.hidden) * 0.02
    labels = torch.full((args.batch, length), -100)
    labels[:, -args.labelled :] = torch.randint(0, args.vocab, (args.batch, args.labelled))
    mask = torch.ones(args.batch, length, dtype=torch.long)
    return model, {"inputs_embeds": embeds, "attention_mask": mask, "labels": labels}


def full(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return model(**batch, use_cache=False).loss


def labelled(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    hidden = model.model(
        inputs_embeds=batch["inputs_embeds"], attention_mask=batch["attention_mask"]
    ).last_hidden_state
    labels = batch["labels"]
    return next_token_loss(model.lm_head, hidden, labels, label_positions(labels))[0]


def timed(
    loss_of: Callable, model: torch.nn.Module, opt: torch.optim.Optimizer, batch: dict, steps: int
) -> float:
    """Mean ms of ``steps`` training steps."""
    start = time.perf_counter()
    for _ in range(steps):
        loss_of(model, batch).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return (time.perf_counter() - start) / steps * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--masked", type=int, default=600, help="unlabelled tokens a row, first")
    p.add_argument("--labelled", type=int, default=4, help="labelled tokens a row, then")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--threads", type=int, default=0, help="0: torch's default")
    p.add_argument("--way", choices=("both", "full", "labelled"), default="both")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model, batch = model_and_batch(args)
    if args.way == "both":  # not in a one-way run, whose peak RSS would count it
        with torch.no_grad():
            a, b = full(model, batch), labelled(model, batch)
        if not torch.allclose(a, b, rtol=1e-5):
            raise SystemExit(f"the losses differ: full {a.item():.6f}, labelled {b.item():.6f}")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    ways = {
        n: w for n, w in {"full": full, "labelled": labelled}.items() if args.way in (n, "both")
    }
    ms: dict[str, list[float]] = {name: [] for name in ways}
    for r in range(args.rounds + 1):
        for name, way in ways.items():
            t = timed(way, model, opt, batch, args.steps)
            if r:  # the first round warms up
                ms[name].append(t)
    machine = common.cpu()
    rows, length = args.batch, args.masked + args.labelled
    kept = {"full": rows * length, "labelled": rows * args.labelled}
    print(
        f"{machine['cpu']}, {torch.get_num_threads()} thread(s), torch {torch.__version__}; "
        f"Llama hidden {args.hidden}, {args.layers} layers, vocabulary {args.vocab}, batch "
        f"{rows} x {length} tokens ({args.labelled} labelled a row); "
        f"{args.rounds} rounds of {args.steps} steps"
    )
    for name in ways:
        mb = kept[name] * args.vocab * 4 / 2**20
        print(
            f"  {name:8s} {statistics.median(ms[name]):8.1f} ms/step "
            f"({min(ms[name]):.1f}-{max(ms[name]):.1f}); logits {mb:8.1f} MB"
        )
    if args.way != "both":
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"  peak RSS of this process: {peak:.0f} MB")
        return
    ratio = statistics.median(f / a for f, a in zip(ms["full"], ms["labelled"], strict=True))
    print(f"  full / labelled: {ratio:.2f}x (median of the rounds' ratios)")


if __name__ == "__main__":
    main()
