"""Where text-to-image's frozen VAE encoder and CLIP text encoder run fastest: PyTorch (fp32, bf16)
or onnxruntime, on one batch of peer_diffusion.py's fine-tune.

Run (``make bench-peer-diffusion`` runs it after the peer; a minute on 2 quiet CPU cores):

    python benchmarks/diffusion_frozen.py --rounds 5 --out benchmarks/results/diffusion-frozen.json

ortft runs both parts in the task's collate, in PyTorch under ``no_grad`` in fp32, numpy in and
out (``ortft.families.text_to_image.diffusion.Frozen``). This times that call against the
others a run could make, on the bench's batch: the first 32 training digits at 32x32 (the peer's transforms)
and their captions' 32 character ids, the parts built as peer_diffusion.py builds them (seed 42:
ortft's weights). Routes, each numpy in and numpy out as collate calls them:

- ``torch``: what ortft does (fp32, ``no_grad``);
- ``torch-bf16``: the same under ``torch.autocast("cpu", torch.bfloat16)``;
- ``torch-bf16-weights``: a bfloat16 copy of the part, as diffusers' script runs them with
  ``--mixed_precision bf16`` (its ``weight_dtype``);
- ``ort``: the part exported to ONNX (TorchScript exporter, opset 17, fixed shapes) in an
  ``onnxruntime.InferenceSession`` on the CPU execution provider, intra-op threads = torch's.

The VAE's output is its latent mean and standard deviation times the scaling factor (what
``Frozen.latent_moments`` returns); the text encoder's the last hidden states. ORT's parity
against PyTorch fp32 (the largest absolute difference) is in the JSON.

``--rounds`` rounds, alternating (each part: torch, torch-bf16, torch-bf16-weights, ort), each
measurement the median of ``--calls`` calls after one untimed call per route up front; a
round waits for a quiet machine first (peer_common.wait_quiet, ``--max-busy``, ``--wait``) and
records the CPU share others took while it ran. Per part: the median ms of each route, the
per-round ratio of torch fp32 to each route (its median and range), the fastest route, and
whether ORT beats PyTorch fp32 by more than ``MARGIN`` (15%): the bar for moving them out of
PyTorch (the report says so; this file changes nothing in ortft).

Measured (2026-12-03, 2 cores of an AMD EPYC with AVX-512 BF16, the shared machine mostly
quiet: others took 0-1% of the CPU in 4 of the 5 rounds, 30% in the first; ``--rounds 5
--calls 10``, 40 s), ms for the batch, and the speed against PyTorch fp32:

    part          torch   torch-bf16       torch-bf16-weights   ort
    vae_encoder   21.6    17.0 (1.27x)     15.7 (1.42x)         12.0 (1.84x, 1.73-2.03)
    text_encoder   2.0     2.6 (0.80x)      1.9 (1.12x)          1.1 (1.73x, 1.31-3.28)

ORT is the fastest for both, past the 15% bar, with parity 2.2e-7 (VAE moments) and 2.0e-6
(hidden states). ortft still runs them in PyTorch fp32: together they are 23.6 ms of a ~590 ms
fp32 step at this size, and ORT would save 10.5 ms of it (1.8%), against an export of both
parts at every run's start, a second numerics path for the frozen parts (GPU runs included)
and resumed runs whose losses must match the uninterrupted ones'.
"""

from __future__ import annotations

import argparse
import copy
import os
import resource
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import peer_common as common  # benchmarks/: the script's folder is on sys.path
import peer_diffusion as peer

MARGIN = 0.15  # ORT must beat PyTorch fp32 by more than this to be worth moving the parts


def inputs(tokenizer: Any) -> dict[str, Any]:
    """The bench's first batch as numpy: pixels [32, 3, 32, 32] in [-1, 1], ids [32, 32]."""
    import numpy as np

    data = peer.dataset(tokenizer)
    items = peer.collate_fn([data[i] for i in range(peer.BATCH)])
    return {
        "pixels": items["pixel_values"].numpy(),
        "ids": items["input_ids"].numpy().astype(np.int64),
    }


def as_module(forward: Callable[[Any, Any], Any], part: Any) -> Any:
    """``forward(part, x)`` as a torch module (what torch.onnx.export takes), in eval mode."""
    import torch

    class Part(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.part = part

        def forward(self, x: Any) -> Any:
            return forward(self.part, x)

    return Part().eval()


def moments(vae: Any, pixels: Any) -> tuple[Any, Any]:
    """The VAE's latent mean and std times its scaling factor (``Frozen.latent_moments``)."""
    dist = vae.encode(pixels).latent_dist
    s = float(vae.config.scaling_factor)
    return dist.mean * s, dist.std * s


def hidden(text_encoder: Any, ids: Any) -> Any:
    """The text encoder's last hidden states (``Frozen.hidden_states``)."""
    return text_encoder(ids)[0]


def routes(module: Any, x: Any, folder: Path, name: str) -> dict[str, Callable[[], Any]]:
    """Each route's call of ``module`` on the numpy batch ``x``: numpy in, numpy out."""
    import numpy as np
    import onnxruntime as ort
    import torch

    half = copy.deepcopy(module).to(torch.bfloat16)
    path = folder / f"{name}.onnx"
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's notes on CLIP's shape checks: fixed shapes
        torch.onnx.export(module, (torch.from_numpy(x),), str(path), input_names=["x"],
                          opset_version=17, dynamo=False)  # fmt: skip
    options = ort.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    floats = x.dtype == np.float32

    def run_torch(model: Any, bf16: bool, cast: bool) -> Callable[[], Any]:
        def call() -> Any:
            t = torch.from_numpy(x)
            with torch.no_grad(), torch.autocast("cpu", torch.bfloat16, enabled=bf16):
                out = model(t.to(torch.bfloat16) if cast and floats else t)
            outs = out if isinstance(out, tuple) else (out,)
            return tuple(o.float().numpy() for o in outs)

        return call

    return {
        "torch": run_torch(module, False, False),
        "torch-bf16": run_torch(module, True, False),
        "torch-bf16-weights": run_torch(half, False, True),
        "ort": lambda: tuple(session.run(None, {"x": x})),
    }


def time_ms(call: Callable[[], Any], calls: int) -> float:
    """The median of ``calls`` timed calls, in ms."""
    spent = []
    for _ in range(calls):
        t0 = time.perf_counter()
        call()
        spent.append(1000 * (time.perf_counter() - t0))
    return statistics.median(spent)


def summarize(rounds: list[dict[str, dict[str, float]]]) -> dict[str, Any]:
    """Per part: each route's median ms, the per-round ratio torch fp32 / route (median, range),
    the fastest route and whether ORT beats PyTorch fp32 by more than ``MARGIN``."""
    out: dict[str, Any] = {}
    for part in rounds[0]:
        runs = [r[part] for r in rounds]
        row: dict[str, Any] = {"ms": {k: statistics.median(r[k] for r in runs) for k in runs[0]}}
        ratios = {k: [r["torch"] / r[k] for r in runs] for k in runs[0]}
        row["vs_torch"] = {k: statistics.median(v) for k, v in ratios.items()}
        row["vs_torch_range"] = {k: [min(v), max(v)] for k, v in ratios.items()}
        row["fastest"] = min(row["ms"], key=row["ms"].get)
        row["ort_gain"] = row["vs_torch"]["ort"] - 1.0  # > 0: ORT faster than where ortft runs it
        row["move_to_ort"] = row["ort_gain"] > MARGIN
        out[part] = row
    return out


def print_report(result: dict[str, Any]) -> None:
    """The table (stdout): per part and route, ms and the speed against PyTorch fp32."""
    print(f"diffusion-frozen: {result['rounds']} round(s) x {result['calls']} calls, batch "
          f"{result['batch']}, {result['resolution']}x{result['resolution']} images, "
          f"{result['tokens']} tokens, {result['threads']} threads")  # fmt: skip
    print(f"{'part':13s} {'route':19s} {'ms':>8s} {'vs torch fp32':>20s}")
    for part, row in result["parts"].items():
        for route, ms in row["ms"].items():
            lo, hi = row["vs_torch_range"][route]
            ratio = f"{row['vs_torch'][route]:5.2f}x ({lo:.2f}-{hi:.2f})"
            print(f"{part:13s} {route:19s} {ms:8.1f} {ratio:>20s}")
    for part, row in result["parts"].items():
        where = "move it to ORT" if row["move_to_ort"] else "keep it in PyTorch fp32 (ortft's)"
        print(f"diffusion-frozen: {part}: fastest {row['fastest']}; ORT {row['ort_gain']:+.0%} "
              f"against PyTorch fp32 (the bar: +{MARGIN:.0%}): {where}; ORT's parity "
              f"{result['parity'][part]:.1e}")  # fmt: skip


def measure(a: argparse.Namespace) -> dict[str, Any]:
    import numpy as np
    import torch

    from ortft.families.text_to_image.diffusion import char_tokenizer

    with tempfile.TemporaryDirectory(prefix="diffusion-frozen-") as tmp:
        tokenizer = char_tokenizer(Path(tmp) / "tokenizer", peer.TEXT["max_position_embeddings"])
        text, vae, _ = peer.models(tokenizer)
        x = inputs(tokenizer)
        parts = {
            "vae_encoder": routes(as_module(moments, vae), x["pixels"], Path(tmp), "vae_encoder"),
            "text_encoder": routes(as_module(hidden, text), x["ids"], Path(tmp), "text_encoder"),
        }
        parity = {}
        for part, calls in parts.items():
            for call in calls.values():  # each route once, untimed (ORT's first run allocates)
                call()
            ref, got = calls["torch"](), calls["ort"]()
            parity[part] = max(float(np.abs(r - g).max()) for r, g in zip(ref, got, strict=True))
        rounds, others = [], []
        for i in range(a.rounds):
            common.wait_quiet(a.max_busy, a.wait)
            busy0, own0, t0 = common.cpu_busy_s(), _own_cpu_s(), time.perf_counter()
            rounds.append({p: {r: time_ms(c, a.calls) for r, c in calls.items()}
                           for p, calls in parts.items()})  # fmt: skip
            wall = time.perf_counter() - t0
            share = (common.cpu_busy_s() - busy0 - (_own_cpu_s() - own0)) / (wall * os.cpu_count())
            others.append(max(0.0, share))
            ms = "; ".join(f"{p} " + ", ".join(f"{r} {v:.1f}" for r, v in row.items())
                           for p, row in rounds[-1].items())  # fmt: skip
            print(f"diffusion-frozen: round {i + 1}: {ms} ms; others {others[-1]:.0%} of the CPU",
                  file=sys.stderr, flush=True)  # fmt: skip
    return {
        "format_version": 1,
        "rounds": a.rounds,
        "calls": a.calls,
        "batch": peer.BATCH,
        "resolution": peer.RESOLUTION,
        "tokens": peer.TEXT["max_position_embeddings"],
        "threads": torch.get_num_threads(),
        "margin": MARGIN,
        "parts": summarize(rounds),
        "parity": parity,
        "rounds_ms": rounds,
        "others_share": others,
        "machine": common.cpu(),
    }


def _own_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--rounds", type=int, default=5, help="rounds of every part and route")
    p.add_argument("--calls", type=int, default=10, help="timed calls per measurement")
    common.add_wait_options(p)  # before each round
    p.add_argument(
        "--out", type=Path, default=common.REPO / "benchmarks" / "results" / "diffusion-frozen.json"
    )
    a = p.parse_args()
    if a.rounds < 1 or a.calls < 1:
        p.error("--rounds and --calls must be >= 1")
    os.environ.update(common.OFFLINE)
    result = measure(a)
    print_report(result)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    common.write_json(a.out, result)
    print(f"diffusion-frozen: wrote {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
