"""ONNX Runtime's random stream as a function of the seed and the micro-step.

ORT draws dropout masks (ORTModule's graph, and the on-device training graph) from its own
Philox generator, which a checkpoint cannot save: ORT exposes no get-state. Reseeding it before
every micro-batch with a value derived from ``training.seed`` and the micro-step makes the masks
a pure function of where the run is, so a run resumed from a checkpoint draws exactly what the
uninterrupted run drew. Measured before: a 2-layer BERT with dropout 0.1, killed at step 4 and
resumed, drifted by up to 0.025 in the loss over 60 steps. Torch-free (``onnxruntime.set_seed``
is in the base package), so both engines use it.
"""

from __future__ import annotations

_STRIDE = 1_000_003  # a prime: (seed, micro_step) pairs of nearby seeds do not collide early


def stream_seed(seed: int, micro_step: int) -> int:
    """The seed of ORT's generator for micro-batch ``micro_step`` (0-based) of a run."""
    return (seed * _STRIDE + micro_step) % (2**63 - 1)


def reseed(seed: int, micro_step: int) -> None:
    import onnxruntime

    onnxruntime.set_seed(stream_seed(seed, micro_step))
