"""``backend.name: auto``: time a few steps of each backend on the recipe's first batches.

Each candidate gets its own freshly built model and optimizer, which are thrown away after
the probe; every RNG is saved before and restored after, so the run that follows is exactly
the run ``backend.name=<chosen>`` would have been. The choice is the lower median step time
over the probe steps after the first (the first holds ORT's one-off export, reported apart).
"""

from __future__ import annotations

import gc
import logging
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ortft.backends.torch import models
from ortft.backends.torch.wrappers import wrapper
from ortft.checkpoint import store as checkpoint
from ortft.core.errors import BackendError
from ortft.data import batches
from ortft.recipe.io import LoadedRecipe

log = logging.getLogger("ortft")

PROBE_STEPS = 4  # 1 to warm up (ORT exports here) + 3 timed
CANDIDATES = ("torch", "ort")  # torch first: ORT's spinning thread pool would slow torch after it


def _time_backend(
    name: str,
    loaded: LoadedRecipe,
    task: Any,
    tokenizer: Any,
    labels: list[str] | None,
    encoded: Any,
    device: torch.device,
    build_optimizer: Callable[..., Any],
    scratch: Path,
    widths: list[int],
) -> list[float]:
    """Wall time of each of ``PROBE_STEPS`` optimizer steps (one micro-batch each); the width
    of each batch (tokens per row after padding) is appended to ``widths``."""
    r = loaded.recipe
    backend = wrapper(name, r.backend)
    # the same model the PyTorch engine builds (keep the two in step)
    model = models.build_model(
        loaded, task.auto_class, models.vocabulary(task, tokenizer), labels,
        attn=backend.attn_implementation,
    )  # fmt: skip
    task.prepare_model(model, tokenizer)
    if r.adapter is not None:
        model = models.apply_adapter(model, r.adapter)
    module = models.TaskModule(model, task).to(device)
    wrapped = backend.wrap(module, scratch / name)
    wrapped.train()
    params = [p for p in module.parameters() if p.requires_grad]
    optimizer = build_optimizer(params, r, device)
    # the batches the run will see: the task's collate, then cut to data.padding (a probe of
    # max_length batches would time a 3x longer step on short texts than the run then takes)
    rows = batches.train_batches(
        encoded, r.training.batch_size, r.training.seed, r.data.shuffle,
        group_by_length=r.data.group_by_length,
    )  # fmt: skip
    padding = batches.Padding.of(r.data)
    times = []
    for _ in range(PROBE_STEPS):
        t0 = time.perf_counter()
        epoch, batch = next(rows)
        batch = batches.cut(task.collate(batch, epoch, r.training.seed), padding, task.aligned_keys)
        ids = batch.get("input_ids")  # an image or a clip is one "token", as the loop counts
        widths.append(int(ids.shape[1]) if ids is not None else 1)
        inputs = {
            k: torch.from_numpy(v).to(device) for k, v in batch.items() if not k.startswith("_")
        }
        loss, _ = wrapped(**inputs)
        loss.backward()
        backend.after_step(wrapped)
        if r.training.max_grad_norm:
            torch.nn.utils.clip_grad_norm_(params, r.training.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        float(loss)  # wait for the step to finish (a no-op on CPU)
        times.append(time.perf_counter() - t0)
    return times


def choose(
    loaded: LoadedRecipe,
    task: Any,
    tokenizer: Any,
    labels: list[str] | None,
    encoded: Any,
    device: torch.device,
    build_optimizer: Callable[..., Any],
) -> tuple[str, dict[str, Any]]:
    """The faster backend's name and the probe's record for summary.json."""
    rng = checkpoint.rng_state()
    result: dict[str, Any] = {"steps": PROBE_STEPS, "timed_from_step": 2, "backends": {}}
    try:
        with tempfile.TemporaryDirectory(prefix="ortft-probe-") as scratch:
            for name in CANDIDATES:
                try:
                    times = _time_backend(
                        name,
                        loaded,
                        task,
                        tokenizer,
                        labels,
                        encoded,
                        device,
                        build_optimizer,
                        Path(scratch),
                        widths := [],
                    )
                except BackendError as err:  # ORT cannot run this model: torch it is
                    result["backends"][name] = {"error": str(err)}
                    log.info("auto: %s cannot run this model (%s)", name, err)
                    continue
                finally:
                    gc.collect()
                result["backends"][name] = {
                    "first_step_s": round(times[0], 4),
                    "step_times_s": [round(t, 4) for t in times[1:]],
                    "median_step_s": round(statistics.median(times[1:]), 4),
                    "sequence_lengths": widths,
                }
    finally:
        checkpoint.set_rng_state(rng)
    timed = {n: b["median_step_s"] for n, b in result["backends"].items() if "median_step_s" in b}
    if not timed:
        raise BackendError("backend.name=auto: neither backend could run this model")
    chosen = min(timed, key=lambda n: timed[n])
    result["chosen"] = chosen
    parts = ", ".join(f"{n} {t * 1000:.0f} ms/step" for n, t in timed.items())
    log.info(
        "backend: auto chose %s (probe, %d steps each on the first batches: %s)",
        chosen,
        PROBE_STEPS,
        parts,
    )
    return chosen, result
