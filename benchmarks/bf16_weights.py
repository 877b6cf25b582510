"""A lever, not a route: bf16 autocast against a bf16 model with fp32 master weights, on a CPU.

Run (not in CI; a quiet machine; each profile's python):

    .venv-current/bin/python benchmarks/bf16_weights.py [--rounds 8] [--threads 2]

Under autocast the weights stay fp32, so every linear's input is cast to bf16 each time it is
used (q, k and v each cast the same normed hidden state), and the fp32 residual stream, norms
and softmax cast back: these casts were 13-19% of the bf16 steps profiled (benchmarks/README.md,
docs/backends.md). The other way keeps the model itself in bf16 and an fp32 copy of each
weight for the optimizer: the gradients are cast to fp32 for clipping and fused AdamW, and the
updated masters cast back into the model. Activations, norms and softmax then run in bf16.
ortft has no such mode; this measures whether one would pay.

Two of the peer benches' models, random weights, random inputs of the bench's shapes, eager
attention (ortft's bf16 choice on a CPU), a forward + backward + clipping at 1.0 + fused AdamW
per step:

- ``vit``: peer_image.py's ViT (32x32 images, patch 4, hidden 192, 4 layers), batch 32;
- ``whisper``: peer_speech.py's Whisper (d_model 256, 4 + 4 layers, 3 s of 80 mel bins),
  batch 16, 8 label tokens, a vocabulary of 300.

The two settings alternate, ``--rounds`` timed rounds of 3 steps each after one untimed round;
the median round's mean step is printed for each, and autocast / bf16 weights (above 1: the bf16
model is faster).
"""

from __future__ import annotations

import argparse
import copy
from collections.abc import Callable
from typing import Any

import peer_common as common  # benchmarks/: the script's folder is on sys.path
import peer_image
import peer_speech
import torch


def vit() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(**peer_image.VIT, num_labels=10)
    model = ViTForImageClassification._from_config(config, attn_implementation="eager")
    pixels = torch.randn(32, 3, peer_image.IMAGE, peer_image.IMAGE)
    return model, {"pixel_values": pixels, "labels": torch.randint(0, 10, (32,))}


def whisper() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    config = WhisperConfig(
        **peer_speech.WHISPER,
        vocab_size=300,
        pad_token_id=0,
        bos_token_id=2,
        eos_token_id=2,
        decoder_start_token_id=1,
    )
    model = WhisperForConditionalGeneration._from_config(config, attn_implementation="eager")
    frames = 2 * peer_speech.WHISPER["max_source_positions"]  # the encoder's conv halves them
    features = torch.randn(16, peer_speech.WHISPER["num_mel_bins"], frames)
    return model, {"input_features": features, "labels": torch.randint(2, 300, (16, 8))}


def autocast_step(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> Callable[[], None]:
    """fp32 weights, the forward under bf16 autocast: what ortft's bf16 route runs."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def bf16_weights_step(model: torch.nn.Module, batch: dict[str, Any]) -> Callable[[], None]:
    """The model in bf16, fp32 masters for clipping and AdamW, cast back after each update."""
    model = model.to(torch.bfloat16)
    params = list(model.parameters())
    masters = [p.detach().float().requires_grad_() for p in params]
    opt = torch.optim.AdamW(masters, lr=1e-4, fused=True)
    inputs = {k: v.bfloat16() if v.is_floating_point() else v for k, v in batch.items()}

    def step() -> None:
        model(**inputs).loss.backward()
        for master, p in zip(masters, params, strict=True):
            master.grad = None if p.grad is None else p.grad.float()  # an unused pooler: None
            p.grad = None
        torch.nn.utils.clip_grad_norm_(masters, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        with torch.no_grad():
            torch._foreach_copy_(params, masters)

    return step


def compare(name: str, build: Callable[[], tuple[torch.nn.Module, dict]], rounds: int) -> None:
    torch.manual_seed(0)
    model, batch = build()
    model.train()
    steps = {
        "autocast": autocast_step(copy.deepcopy(model), batch),
        "bf16 weights": bf16_weights_step(copy.deepcopy(model), batch),
    }
    ms = common.alternating_ms(steps, rounds, repeat=3)
    amp, pure = ms["autocast"], ms["bf16 weights"]
    print(f"{name}: autocast {amp:.1f} ms, bf16 weights {pure:.1f} ms, {amp / pure:.2f}x")


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--models", default="vit,whisper")
    a = p.parse_args()
    builders = {"vit": vit, "whisper": whisper}
    unknown = sorted(set(a.models.split(",")) - set(builders))
    if unknown:
        p.error(f"--models: unknown {', '.join(unknown)} (use vit, whisper)")
    if a.rounds < 1 or a.threads < 1:
        p.error("--rounds and --threads must be >= 1")
    torch.set_num_threads(a.threads)
    print(f"bf16_weights: torch {torch.__version__}, {a.threads} thread(s), {a.rounds} rounds")
    for name in a.models.split(","):
        compare(name, builders[name], a.rounds)


if __name__ == "__main__":
    main()
