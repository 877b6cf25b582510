"""One Whisper decoder step: the ONNX export against PyTorch's cached step.

    python benchmarks/whisper_step.py [--threads 1] [--past 16] [--runs 30]

A whisper-base-sized model built from a config (d_model 512, 6 encoder + 6 decoder layers,
8 heads, 80 mel bins, 1500 encoder positions, Whisper's 51865 ids; random weights, no download)
is exported with ``ortft.families.speech.graphs.export_graphs`` and run through the runner's
own steps (``cross_cache.Steps`` over ``OnnxWhisper._decode``, what ``ortft predict`` runs): the first step (4 init tokens) fills
the caches, then ``--past`` single-token steps grow the self-attention cache, and the next
``--runs`` single-token steps are timed. PyTorch runs the same steps with its
``EncoderDecoderCache`` (the cross-attention keys and values computed once, at the first step).
The two alternate step by step, so that both see the same load on a shared machine. Both on
``--threads`` intra-op threads, one clip; the median ms of a step is printed as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def _model():
    import torch
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    torch.manual_seed(0)
    config = WhisperConfig(
        vocab_size=51865,
        d_model=512,
        encoder_layers=6,
        decoder_layers=6,
        encoder_attention_heads=8,
        decoder_attention_heads=8,
        encoder_ffn_dim=2048,
        decoder_ffn_dim=2048,
        num_mel_bins=80,
        max_source_positions=1500,
        max_target_positions=448,
    )
    return WhisperForConditionalGeneration(config).eval()


def _onnx_step(model, feats: np.ndarray, folder: Path, threads: int):
    """The runner's step function after the first step (4 init tokens): one token a call."""
    from ortft.export import cross_cache
    from ortft.families.speech import graphs, runner

    graphs.export_graphs(model, feats, folder, 20)
    pair = runner.OnnxWhisper(folder, model.config, threads)
    steps = cross_cache.Steps(pair.decoder, pair._decode, pair.encode(feats))
    steps(np.full((1, 4), model.config.decoder_start_token_id, dtype=np.int64))
    token = np.ones((1, 1), dtype=np.int64)
    return lambda: steps(token)


def _torch_step(model, feats: np.ndarray):
    """PyTorch's cached step after the first step (4 init tokens): one token a call."""
    import torch
    from transformers import DynamicCache, EncoderDecoderCache

    with torch.no_grad():
        hidden = model.get_encoder()(torch.from_numpy(feats)).last_hidden_state
    cache = EncoderDecoderCache(DynamicCache(), DynamicCache())

    def step(tokens):
        with torch.no_grad():
            model(
                decoder_input_ids=tokens,
                encoder_outputs=(hidden,),
                past_key_values=cache,
                use_cache=True,
            )

    step(torch.full((1, 4), model.config.decoder_start_token_id, dtype=torch.long))
    token = torch.ones((1, 1), dtype=torch.long)
    return lambda: step(token)


def _timed(step) -> float:
    t0 = time.perf_counter()
    step()
    return time.perf_counter() - t0


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--past", type=int, default=16)
    ap.add_argument("--runs", type=int, default=30)
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    model = _model()
    feats = np.random.default_rng(0).normal(0, 1, (1, 80, 3000)).astype(np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        steps = {"onnx": _onnx_step(model, feats, Path(tmp), args.threads)}
        steps["torch"] = _torch_step(model, feats)
        for _ in range(args.past):  # the self-attention caches grow to --past positions
            for step in steps.values():
                step()
        times: dict[str, list[float]] = {"onnx": [], "torch": []}
        for _ in range(args.runs):  # alternated: both see the same load on a shared machine
            for name, step in steps.items():
                times[name].append(_timed(step))
    onnx_ms = 1000 * statistics.median(times["onnx"])
    torch_ms = 1000 * statistics.median(times["torch"])
    out = {
        "threads": args.threads,
        "past": args.past,
        "runs": args.runs,
        "onnx_step_ms": round(onnx_ms, 2),
        "torch_step_ms": round(torch_ms, 2),
        "ratio": round(onnx_ms / torch_ms, 3),
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
