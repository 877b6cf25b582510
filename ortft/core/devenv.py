"""Developer overrides: environment variables that change how a run trains, or how fast, from
outside the recipe.

They are for measuring and debugging (``ortft bench``'s variants, the compile tests, a kernel
comparison); a user's run says what it wants in the recipe. Each one a run sees is named on
stderr as it starts and recorded in summary.json (``provenance.developer_overrides``), so no
figure depends on a switch nobody can see. ``tests/test_devenv.py`` fails on an ``ORTFT_*``
variable the package reads that is in neither table below.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

# variable -> what it changes (docs/backends.md#developer-overrides has the values)
OVERRIDES: dict[str, str] = {
    "ORTFT_TORCH_ATTN": "the torch route's attention on a CPU (sdpa | eager)",
    "ORTFT_COMPILE_BACKEND": "backend.compile's compiler (inductor | aot_eager)",
    "ORTFT_ORT_INTRA_OP_THREADS": "the intra-op threads of ORT's sessions (0: ORT's own choice)",
    "ORTFT_ORT_SPINNING": "whether ORT's idle intra-op threads spin-wait (1 | 0)",
    "ORTFT_ORT_OPT_LEVEL": "ORT's graph optimization level (disable | basic | extended | all)",
}

# read from the environment too, but they say where files are, not how a run trains
LOCATIONS: dict[str, str] = {
    "ORTFT_CACHE": "the data, extension, wheel and compile caches (default ~/.cache/ortft)",
    "ORTFT_CUDA11_DIR": "the GPU profile's CUDA 11.8 libraries",
}


def set_overrides(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The developer overrides set (and not empty) in ``environ`` (default: the process's), by name."""
    # os.environ is looked up at each call, not bound as a default: datasets' multi-process
    # map rebinds os.environ to a copy, and a bound default would go on reading the old one
    env = os.environ if environ is None else environ
    return {name: env[name] for name in OVERRIDES if env.get(name)}
