"""Which ONNX Runtime training distribution is installed, and which Pythons have one.

Two PyPI distributions install the same ``onnxruntime`` package with ``onnxruntime.training``:
``onnxruntime-training`` 1.19.2 (the CUDA 11.8 build; wheels for CPython up to 3.11) and
``onnxruntime-training-cpu`` 1.19.2 (CPU only; wheels up to 3.12). 1.19.2 is the final
release of both, so no Python from 3.13 on has ORT training (pip on 3.12 and 3.13 lists no
onnxruntime-training version at all; -cpu lists none on 3.13). The ort profile (``make
setup``) installs it; the current profile (today's torch) has none, so the backends that need
it are refused as a run starts (``backend_problem``), never when a recipe is validated.
Torch-free and cheap: only package metadata is read.
"""

from __future__ import annotations

import functools
import sys
from importlib import metadata

# The CUDA build first: it is the one requirements/lock.txt pins on 3.11.
DISTRIBUTIONS = ("onnxruntime-training", "onnxruntime-training-cpu")
PYTHONS = ((3, 11), (3, 12))  # the Pythons with a 1.19.2 wheel (3.12: -cpu only); make setup's
NEEDS_IT = ("ort", "ort-ondevice")  # the backends that train through it (auto only may)


@functools.lru_cache(maxsize=1)  # asked more than once a run; metadata scans site-packages
def installed() -> tuple[str, str] | None:
    """(distribution, version) of the ORT training package installed, or None."""
    for name in DISTRIBUTIONS:
        try:
            return name, metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def pythons_text() -> str:
    return " and ".join(f"{major}.{minor}" for major, minor in PYTHONS)


def missing(what: str, instead: str, python: tuple[int, int] | None = None) -> str | None:
    """One line when ``what`` needs ONNX Runtime training and this install has none, naming
    the ort profile that has it and ``instead``, the way without it; None when it is installed."""
    if installed() is not None:
        return None
    major, minor = python or tuple(sys.version_info[:2])
    if (major, minor) in PYTHONS:
        why = "which this install lacks (the current profile has none)"
        how = f"install the ort profile (make setup, or pip install 'ortft[ort]'; Python {pythons_text()})"
    else:  # no wheel at all: only a venv on another Python has it
        why = f"which has wheels for Python {pythons_text()} only, not {major}.{minor}"
        how = "install the ort profile on one of them (make setup, or pip install 'ortft[ort]')"
    return f"{what} needs ONNX Runtime training, {why}: {how}, or {instead}"


def backend_problem(backend: str, python: tuple[int, int] | None = None) -> str | None:
    """Why ``backend.name={backend}`` cannot train here (None: it can); checked as a run
    starts, not when a recipe is validated: a recipe means the same on every install."""
    if backend not in NEEDS_IT:
        return None
    return missing(f"backend.name={backend}", "train with backend.name=torch or auto", python)


def absent() -> str | None:
    """Why backend.name=auto cannot consider ORTModule here (None: it can)."""
    if installed() is not None:
        return None
    return "ONNX Runtime training is not installed (the current profile has none)"
