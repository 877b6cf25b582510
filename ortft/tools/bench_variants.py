"""What ``ortft bench --backends`` names: a ``backend.name`` value or a bench-only variant
(``VARIANTS``), each optionally followed by ``+key=value`` settings (a dotted recipe key or an
``ORTFT_*`` / ``ORTMODULE_*`` / ``OMP_*`` / ``GOMP_*`` / ``MKL_*`` environment variable), parsed
into ``Variant``s."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ortft.core.errors import UsageError
from ortft.env import ort_training

# bench-only variants: (recipe overrides, environment for the worker process)
# "torch", the baseline, is plain PyTorch: what a PyTorch user would run, so backend.unpad is
# off (``torch+backend.unpad=auto`` measures ortft's torch route as a recipe runs it)
PLAIN_TORCH = {"backend.name": "torch", "backend.unpad": "false"}
VARIANTS: dict[str, tuple[dict[str, str], dict[str, str]]] = {
    "ort": ({"backend.name": "ort"}, {}),
    "torch": (PLAIN_TORCH, {}),
    # trains in onnxruntime.training.api; its process imports PyTorch only to build the artifacts
    "ort-ondevice": ({"backend.name": "ort-ondevice"}, {}),
    "torch-eager-attn": (PLAIN_TORCH, {"ORTFT_TORCH_ATTN": "eager"}),
    # backend.compile=true (inductor, dynamic shapes): its first step compiles, and the next
    # may compile again (a new length): give it --warmup 4 or more
    "torch-compile": ({"backend.name": "torch", "backend.compile": "true"}, {}),
}
# A variant that may fail or time out without failing the bench (recorded as skipped).
OPTIONAL = {"torch-compile"}
# environment a variant may set: ortft's and ORTModule's own knobs, the thread runtimes' (OpenMP, MKL)
_ENV_KEY = re.compile(r"^(ORTFT|ORTMODULE|OMP|GOMP|MKL)_[A-Z0-9_]+$")


def default_spec() -> str:
    """``--backends`` when none is given: ORTModule against plain PyTorch where ONNX Runtime's
    training build is installed (the ort profile), else the two routes the current profile
    trains on: plain PyTorch and compiled."""
    return "ort,torch" if ort_training.installed() is not None else "torch,torch-compile"


@dataclass
class Variant:
    label: str
    overrides: dict[str, str]
    env: dict[str, str]


def _split_top(spec: str) -> list[str]:
    """Split on the commas outside brackets: ``ort+backend.pytorch_kernels=[gelu,layer_norm],torch``."""
    items, depth, current = [], 0, ""
    for char in spec:
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += char
    return [*items, current]


def parse_variants(spec: str | None) -> list[Variant]:
    out = []
    spec = default_spec() if spec is None else spec
    for item in [s.strip() for s in _split_top(spec) if s.strip()]:
        base, *settings = item.split("+")
        if base not in VARIANTS:
            raise UsageError(
                f"--backends: unknown backend {base!r}; choose from "
                f"{', '.join(VARIANTS)} (optionally +key=value)"
            )
        overrides, env = dict(VARIANTS[base][0]), dict(VARIANTS[base][1])
        for setting in settings:
            key, sep, value = setting.partition("=")
            if not sep:
                raise UsageError(f"--backends: {setting!r} in {item!r} is not key=value")
            if _ENV_KEY.match(key):
                env[key] = value
            elif "." in key:
                overrides[key] = value
            else:
                raise UsageError(
                    f"--backends: {key!r} in {item!r} is neither a dotted recipe key "
                    "nor an ORTFT_*, ORTMODULE_*, OMP_*, GOMP_* or MKL_* environment variable"
                )
        out.append(Variant(item, overrides, env))
    if not out:
        raise UsageError("--backends: give at least one backend")
    if len({v.label for v in out}) != len(out):
        raise UsageError("--backends: a backend is listed twice")
    return out
