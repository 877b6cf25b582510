"""``backend.compile``: the torch backend's forward through ``torch.compile`` (inductor).

How it composes: the compiled callable is the outermost layer of the forward, around DDP when
there is one (``torch.compile(DDP(module))``, the order torch 2.6 documents: dynamo's
DDPOptimizer splits the graph at DDP's bucket boundaries so the gradient all-reduce still
overlaps the backward; ``DDP(torch.compile(module))`` compiles one whole backward whose
all-reduces only start after it). The model the engine saves, evaluates and exports is never
the compiled wrapper, so checkpoints, best/ and final/ carry no ``_orig_mod.`` prefix.

Dynamic shapes (``dynamic=True``): length-aware batches (``data.padding: longest``,
``group_by_length``) change the sequence length every step; one graph with a symbolic length
and batch serves them all. torch's default (automatic dynamic) compiles a static graph first
and recompiles once the length changes: two compiles where one does.

Inductor's on-disk cache lives under ``${ORTFT_CACHE:-~/.cache/ortft}/inductor`` (unless
``TORCHINDUCTOR_CACHE_DIR`` is set): a second run of the same model reuses the generated
kernels and pays dynamo's tracing only. Each compile time measured (the ``auto`` probe's, and a
compiled run's first step: ``CompileClock``) is kept in ``compile-times.json`` beside it, so
the probe knows a compile's cost before paying it (``auto.py``).
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import torch

from ortft.backends.torch import distributed
from ortft.core.fsutil import write_json_atomic

log = logging.getLogger("ortft")


def cache_root() -> Path:
    return Path(os.environ.get("ORTFT_CACHE") or Path.home() / ".cache" / "ortft")


def use_ortft_cache() -> None:
    """Inductor's cache under ``ORTFT_CACHE`` unless the user named one. Called when a run that
    may compile starts, before its model is built: from some torch release after 2.6 on (seen
    with 2.13), the first ``import torch._dynamo``, which transformers' model code makes,
    resolves the cache folder and writes torch's default (``/tmp/torchinductor_<user>``) into
    ``TORCHINDUCTOR_CACHE_DIR``, so a default set at the first compile came too late."""
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_root() / "inductor"))


def prepare() -> None:
    """Before the first compile: the cache directory, floats specialized, and torch 2.6's
    missing ``torch.compiler.is_exporting``."""
    use_ortft_cache()
    # the model's float attributes (norm epsilons, attention scalings) as constants: traced as
    # symbols under dynamic=True (torch 2.13), then specialized by guards, which restarts the
    # whole trace once (torch 2.6 specializes them anyway)
    torch._dynamo.config.specialize_float = True
    if not hasattr(torch.compiler, "is_exporting"):
        # torch 2.6 lacks it; transformers 5.24's masking_utils calls it inside a try/except
        # that returns False in eager mode, but dynamo fails on the missing attribute instead
        # of taking the except (InternalTorchDynamoError). False is what eager mode gets, so
        # the compiled model masks as the eager one does.
        torch.compiler.is_exporting = lambda: False  # type: ignore[attr-defined]
        _torch_in_output_capturing()


def _torch_in_output_capturing() -> None:
    """torch 2.6's dynamo resumes a function after a graph break in code that reads ``torch``
    from the function's module; transformers' ``utils/output_capturing.py`` (the wrapper around
    every model's forward) imports torch for typing only, so a graph break there (the LLaVA's
    language model) failed with ``NameError: name 'torch' is not defined``."""
    try:
        from transformers.utils import output_capturing
    except ImportError:  # an older transformers: no such module
        return
    if not hasattr(output_capturing, "torch"):
        output_capturing.torch = torch  # type: ignore[attr-defined]


# ORTFT_COMPILE_BACKEND=aot_eager: dynamo + AOTAutograd without inductor's code generation, a
# test and debugging knob (seconds instead of minutes on 2 cores); the route is the same
COMPILE_BACKENDS = ("inductor", "aot_eager")


def compiler() -> str:
    """inductor, unless ``ORTFT_COMPILE_BACKEND`` names another of ``COMPILE_BACKENDS``."""
    return os.environ.get("ORTFT_COMPILE_BACKEND", "inductor")


def compile_forward(forward: Any) -> Any:
    prepare()
    backend = compiler()
    if backend not in COMPILE_BACKENDS:
        raise ValueError(f"ORTFT_COMPILE_BACKEND={backend}: use inductor or aot_eager")
    return torch.compile(forward, backend=backend, dynamic=True)


def graphs_compiled() -> int:
    """Graphs dynamo has compiled in this process (recompiles included)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


class CompileClock:
    """The first step's wall time (forward + backward: both graphs compile there), logged once
    and remembered under ``key`` (``route_key``) for the ``auto`` probe: a run the user
    compiled tells the next ``auto`` run what this model's compile costs."""

    def __init__(self, key: str | None = None) -> None:
        self.key = key
        self.seconds: float | None = None
        self._t0: float | None = None
        self._graphs0 = 0

    def start(self) -> None:
        if self._t0 is None:
            self._t0 = time.perf_counter()
            self._graphs0 = graphs_compiled()

    def stop(self) -> None:
        if self.seconds is None and self._t0 is not None:
            self.seconds = time.perf_counter() - self._t0
            cached = ""  # aot_eager generates no kernels
            if compiler() == "inductor":
                cached = f"; kernels cached in {os.environ.get('TORCHINDUCTOR_CACHE_DIR')}"
            log.info(
                "torch.compile: the first step took %.1f s (%s compiling forward and backward%s)",
                self.seconds,
                compiler(),
                cached,
            )
            if self.key is not None:  # the compile plus one step's work: a slight overestimate
                remember_compile_s(self.key, self.seconds)

    def record(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "compiler": compiler(),
            "dynamic": True,
            "cache_dir": os.environ.get("TORCHINDUCTOR_CACHE_DIR"),
        }
        if self.seconds is not None:
            out["first_step_s"] = round(self.seconds, 3)
            out["graphs"] = graphs_compiled() - self._graphs0
        return out


# ---- measured compile times, for the auto probe
def _times_file() -> Path:
    return cache_root() / "compile-times.json"


def route_key(recipe: Any, device: torch.device, dtype: str) -> str:
    """What a compile's cost depends on: the model, the task, the device, the dtype, torch and
    the compiler (an aot_eager debugging run's time says nothing of inductor's)."""
    m = recipe.model
    model = m.name_or_path or json.dumps(m.from_config.model_dump(), sort_keys=True)
    adapter = "+lora" if recipe.adapter is not None else ""
    route = f"{recipe.task.name}|{device.type}|{dtype}|torch {torch.__version__}|{compiler()}"
    return f"{model}{adapter}|{route}"


def known_compile_s(key: str) -> float | None:
    try:
        return float(json.loads(_times_file().read_text())[key])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def remember_compile_s(key: str, seconds: float) -> None:
    """Keep ``seconds`` under ``key``; under torchrun rank 0 alone writes (every rank measured
    the same compile, and one writer loses no other key to a concurrent rewrite)."""
    if not distributed.is_main():
        return
    path = _times_file()
    try:
        times = json.loads(path.read_text())
    except (OSError, ValueError):
        times = {}
    times[key] = round(seconds, 3)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, dict(sorted(times.items())), indent=1)
    except OSError as err:  # a read-only home: the probe only loses its memory
        log.debug("could not record the compile time in %s: %s", path, err)
