"""Gradients of on-device training artifacts against PyTorch's, for batches of several shapes.

Run as a script by tests/test_ondevice.py (a heap corruption in ORT then fails one test instead
of killing pytest): ``python ondevice_gradients.py bert|gpt2 OUT_DIR``. Prints one JSON object:
the largest relative gradient difference per batch shape, over every parameter.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch

# Batch 16 and more: ORT 1.19's position-embedding GatherGrad wrote past its output from batch
# 14 on (tiny BERT) when the ids were broadcast (1, sequence); lengths vary as with padding=longest.
SHAPES = [(16, 16), (16, 8), (20, 12), (4, 24)]
VOCAB = 150


def _model(arch: str) -> torch.nn.Module:
    from transformers import BertConfig, BertForSequenceClassification, GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    if arch == "bert":
        cfg = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                         num_attention_heads=2, intermediate_size=64, hidden_dropout_prob=0.0,
                         attention_probs_dropout_prob=0.0, num_labels=3)  # fmt: skip
        model = BertForSequenceClassification(cfg)
    else:
        cfg = GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=2, n_positions=64,
                         resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)  # fmt: skip
        model = GPT2LMHeadModel(cfg)
    model.config._attn_implementation = "eager"
    return model.train()


def _batch(arch: str, rows: int, length: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    ids = rng.integers(5, VOCAB, size=(rows, length)).astype(np.int64)
    mask = np.ones_like(ids)
    mask[-1, length // 2 :] = 0  # the last row padded, as a batch cut to its longest row
    if arch == "bert":
        labels = rng.integers(0, 3, size=(rows,)).astype(np.int64)
    else:
        labels = np.where(mask == 1, ids, -100).astype(np.int64)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def main(arch: str, out: Path) -> None:
    from ortft.backends.ondevice import artifacts
    from ortft.backends.ondevice.engine import training_api

    model = _model(arch)
    task = "sequence-classification" if arch == "bert" else "causal-lm"
    rng = np.random.default_rng(0)
    artifacts.generate_training_artifacts(model, task, out, _batch(arch, 2, 16, rng),
                                          loss_scale=True)  # fmt: skip
    api = training_api()
    state = api.CheckpointState.load_checkpoint(str(out / "checkpoint"))
    module = api.Module(str(out / "training_model.onnx"), state, str(out / "eval_model.onnx"))
    module.train()
    worst = {}
    for rows, length in SHAPES:
        batch = _batch(arch, rows, length, rng)
        module.lazy_reset_grad()  # the next run overwrites the accumulated gradients
        feeds = [batch[k] for k in ("input_ids", "attention_mask", "labels")]
        loss = float(module(*feeds, np.array(1.0, dtype=np.float32)))
        model.zero_grad()
        ref = model(**{k: torch.from_numpy(v) for k, v in batch.items()}).loss
        ref.backward()
        # A difference relative to the largest gradient of all: some are zero in exact
        # arithmetic (attention's key bias), and their float noise has no scale of its own.
        grads = {n: p.grad.numpy() for n, p in model.named_parameters() if n in state.parameters}
        scale = max(float(np.abs(g).max()) for g in grads.values())  # tied ones: in the graph once
        diffs = {n: float(np.abs(state.parameters[n].grad - g).max()) / scale
                 for n, g in grads.items()}  # fmt: skip
        name = max(diffs, key=diffs.get)
        worst[f"{rows}x{length}"] = {
            "loss": loss, "torch_loss": float(ref), "parameter": name, "rel_diff": diffs[name]
        }  # fmt: skip
    print(json.dumps(worst))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
