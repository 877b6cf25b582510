"""The reference model's log-probabilities (DPO, IPO): each pair's summed response log-probs
under the policy before training, computed once and cached with the tokenized data.

An entry is ``<ORTFT_CACHE>/tokenized/<key>/`` (``ortft cache`` lists and prunes it with the
token arrays), its key a hash of the reference's weights, of the split's token arrays and of
how the pass runs (``pass_settings``): a changed base model, or changed data, computes afresh,
and so does another attention kernel, padding, device or torch, since each moves the
log-probs' last bits and a run's losses must not depend on which recipe or venv filled the
cache first. The pass runs in eager PyTorch on the freshly built model, before any wrapper
(never through ORTModule's graph) and before a resumed run loads its checkpoint, so a resumed
run reads the entry its first start wrote. Each chunk of pairs is cut as training's batches
are (``data.padding``: by default its longest row rounded up to ``data.pad_to_multiple_of``),
not run at ``data.max_length``: the trailing padding changes no real token's log-prob under
the causal mask, only the time the pass takes.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ortft.data import batches, tokenized
from ortft.data.encoded import Encoded
from ortft.families.preference.task import REJECTED

log = logging.getLogger("ortft")
ROWS = 8  # pairs per reference forward
FILE = "reference.npy"  # [pairs, 2]: the chosen and rejected sums, float32


class WithReference(Encoded):
    """A split's arrays with ``ref_chosen`` and ``ref_rejected`` beside them (filled by
    ``fill`` once the model is built; every batch taken after carries them). ``padding``:
    the recipe's ``data`` padding, which the reference pass cuts its chunks with."""

    def __init__(self, base: Encoded, padding: batches.Padding | None = None):
        self.base = base
        self.arrays = base.arrays
        self.padding = padding or batches.Padding()
        self.reference: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.base)

    def take(self, index: np.ndarray) -> dict[str, np.ndarray]:
        out = self.base.take(index)
        if self.reference is None:
            raise RuntimeError("the reference log-probs are taken before they were computed")
        ref = self.reference[np.asarray(index, dtype=np.int64)]
        out["ref_chosen"], out["ref_rejected"] = ref[:, 0], ref[:, 1]
        return out

    def column(self, name: str) -> np.ndarray:
        return self.base.column(name)


def _chunks(
    encoded: Encoded, padding: batches.Padding | None = None
) -> Iterator[dict[str, np.ndarray]]:
    """``ROWS`` pairs at a time, cut to the length ``padding`` gives their longest (whole
    without one)."""
    for start in range(0, len(encoded), ROWS):
        chunk = encoded.take(np.arange(start, min(start + ROWS, len(encoded))))
        yield chunk if padding is None else batches.cut(chunk, padding, batches.ALIGNED + REJECTED)


def weights_hash(model: Any) -> str:
    """sha256 of the model's parameters and buffers (names, dtypes, shapes, bytes)."""
    import torch

    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}".encode())
        h.update(t.view(-1).view(torch.uint8).numpy().tobytes())  # bf16 has no numpy dtype
    return h.hexdigest()


def data_hash(encoded: Encoded) -> str:
    h = hashlib.sha256()
    for batch in _chunks(encoded):
        for name in ("input_ids", "labels", "rejected_input_ids", "rejected_labels"):
            h.update(np.ascontiguousarray(batch[name], dtype=np.int64).tobytes())
    return h.hexdigest()


def pass_settings(model: Any, padding: batches.Padding) -> str:
    """What besides the weights and the tokens decides the log-probs' bits: the attention
    kernel, the chunks' padding, the device and torch's version (a resumed run builds its model
    as its first start did, so it reads that start's entry)."""
    import torch

    attention = getattr(model.config, "_attn_implementation", None)
    device = next(model.parameters()).device.type
    return f"{attention}|{padding}|{ROWS} rows|{device}|torch {torch.__version__}"


def compute(model: Any, encoded: Encoded, padding: batches.Padding | None = None) -> np.ndarray:
    """[pairs, 2]: each pair's chosen and rejected summed response log-probs under ``model``
    (eval mode, no gradient, one forward for both sequences, each chunk cut by ``padding``)."""
    import torch

    from ortft.families.preference.losses import preference_scores

    was_training = model.training
    model.eval()
    out = []
    device = next(model.parameters()).device
    try:
        with torch.no_grad():
            for batch in _chunks(encoded, padding):
                t = {
                    k: torch.from_numpy(np.ascontiguousarray(v)).to(device)
                    for k, v in batch.items()
                }
                out.append(preference_scores(model, t).cpu().numpy())
    finally:
        model.train(was_training)
    return np.concatenate(out).astype(np.float32)


def fill(model: Any, split: WithReference, name: str, weights: str | None = None) -> bool:
    """Fill ``split``'s reference from its cache entry, or compute and store it; True on a hit.
    ``weights``: ``weights_hash(model)``, where the caller has it already."""
    settings = pass_settings(model, split.padding)
    inputs = f"{weights or weights_hash(model)}|{data_hash(split.base)}|{settings}"
    key = hashlib.sha256(inputs.encode()).hexdigest()
    entry = tokenized.root() / f"reference-{key[:24]}"
    t0 = time.perf_counter()

    def build(tmp: Path) -> dict[str, Any]:
        values = compute(model, split.base, split.padding)
        np.save(tmp / FILE, values)
        return {
            "source": f"reference log-probs of the {name} split",
            "task": "preference",
            "rows": len(values),
            "computed_with": settings,
            "created": time.time(),
            "compute_s": round(time.perf_counter() - t0, 3),
        }

    hit = tokenized.make_once(entry, build)
    split.reference = np.load(entry / FILE)
    how = "cache hit" if hit else f"computed in {time.perf_counter() - t0:.1f}s"
    log.info("reference log-probs: %d %s pairs (%s)", len(split.reference), name, how)
    return hit
