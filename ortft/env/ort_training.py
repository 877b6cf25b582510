"""Which ONNX Runtime training distribution is installed, and which Pythons have one.

Two PyPI distributions install the same ``onnxruntime`` package with ``onnxruntime.training``:
``onnxruntime-training`` 1.19.2 (the CUDA 11.8 build; wheels for CPython up to 3.11) and
``onnxruntime-training-cpu`` 1.19.2 (CPU only; wheels up to 3.12). 1.19.2 is the final
release of both, so no Python from 3.13 on has ORT training (pip on 3.12 and 3.13 lists no
onnxruntime-training version at all; -cpu lists none on 3.13). Torch-free and cheap: only
package metadata is read.
"""

from __future__ import annotations

import functools
import sys
from importlib import metadata

# The CUDA build first: it is the one requirements/lock.txt pins on 3.11.
DISTRIBUTIONS = ("onnxruntime-training", "onnxruntime-training-cpu")
PYTHONS = ((3, 11), (3, 12))  # the Pythons with a 1.19.2 wheel (3.12: -cpu only); make setup's


@functools.lru_cache(maxsize=1)  # recipe validation asks often; metadata scans site-packages
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


def recipe_problem(backend: str, python: tuple[int, int] | None = None) -> str | None:
    """One line when ``backend`` (ort, ort-ondevice, auto) cannot run here: no ORT training."""
    if installed() is not None:
        return None
    major, minor = python or tuple(sys.version_info[:2])
    if (major, minor) in PYTHONS:
        why = "it is not installed (make setup, or pip install -r requirements/lock.txt)"
    else:
        why = f"it has wheels for Python {pythons_text()} only, not {major}.{minor}"
    return (
        f"backend.name={backend} needs ONNX Runtime training and {why}; "
        "backend.name=torch trains without it"
    )
