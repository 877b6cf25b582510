"""``backend.name: auto`` (and ``backend.compile: auto``): time a few steps of each route the
recipe allows on its first batches, then train with the one whose whole run is estimated fastest.

A route is (backend, compile, dtype, weights): ``torch`` eager, ``torch`` compiled
(``backend.compile`` true: only compiled; auto: both; false: only eager), and ``ort`` under
``backend.name: auto`` where ONNX Runtime training is installed (else recorded as skipped, with
why); each in the precision it runs natively when ``precision.dtype: auto`` (bf16 on torch where
the hardware has it, fp32 on ORT's CPU provider: ``device.resolve_precision``).

Where torch's native precision is bf16, eager torch is also timed in the alternatives the recipe
leaves open: fp32 under ``precision.dtype: auto`` on a CPU (a small model's bf16 step can be
slower than its fp32 one there: bf16 pays casts, and small GEMMs gain little from it), and a
bf16 copy of the weights under ``precision.weights: auto`` (``master_weights``). The compiled
candidate runs in the precision of the fastest eager one (a compile is too dear to pay once per
precision); under ``backend.compile: true`` there are no alternatives. A candidate that runs
out of memory is recorded with its error, as one ORT cannot export is, and the rest weighed.

Each candidate gets its own freshly built model and optimizer, which are thrown away after
the probe; every RNG is saved before and restored after, so the run that follows is exactly
the run ``backend.name=<chosen>`` (with its compile and dtype) would have been.

The first eager torch candidate in each precision runs its batches once untimed before its
timed pass: a fresh process's first steps in a precision (oneDNN's primitives for each new
shape, the allocator's growth) are slower, and whichever candidate ran first in that precision
paid it for the later ones, so the probe's order picked between two bf16 candidates whose steps
were level (docs/backends.md, "A warm process for every eager candidate").

The estimate: ``one_off_s + median_step_s x run steps``, where the median is over the probe
steps after the first and ``one_off_s`` is the first step's excess over that median where the
route does work of its own there (ORT's export, inductor's compile) — the run pays it again, so
a short run does not pick a route whose one-off cost it cannot earn back. An eager torch
candidate is charged none: the run after the probe does not warm its process again.

The compiled candidate's compile is paid before it can be measured, so under
``backend.compile: auto`` it is probed only when its expected compile time is at most
``MAX_COMPILE_SHARE`` of the eager torch run's estimate: the compile time measured last time
for this model, task, device, dtype, torch and compiler (``compiled.known_compile_s``; every
probe that compiles records it, and every ``backend.compile: true`` run its first step), else
``UNKNOWN_COMPILE_S``. Numbers (docs/backends.md, "Compiled PyTorch"): on the busy 2-core dev
CPU the tiny 2-layer test model's first compiled step took 230 s from an empty inductor cache
and 51 s from a warm one, bert-cls's 77 s, MiniLM's 115 s; a compile costing more than a
fifth of the eager run is more than compiled steps were measured to save (MiniLM's fp32
steps: nothing).
"""

from __future__ import annotations

import gc
import logging
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from ortft.backends.torch import compiled, hf_config, master_weights, models
from ortft.backends.torch import device as runtime
from ortft.backends.torch.wrappers import wrapper
from ortft.checkpoint import store as checkpoint
from ortft.core.errors import BackendError
from ortft.data import batches
from ortft.env import ort_training
from ortft.recipe.io import LoadedRecipe
from ortft.tasks import protocols

log = logging.getLogger("ortft")

PROBE_STEPS = 4  # 1 to warm up (ORT exports, inductor compiles here) + 3 timed
MAX_COMPILE_SHARE = 0.2  # of the eager run's estimate (module docstring)
UNKNOWN_COMPILE_S = 120.0  # an unmeasured model's first compile: 77-230 s measured here


@dataclass(frozen=True)
class Route:
    backend: str
    compile: bool
    dtype: str
    weights: str = "fp32"  # bf16: a bf16 copy of the model trains (master_weights)
    tag: str = ""  # names an alternative to the native precision: fp32, bf16w

    @property
    def label(self) -> str:
        return (
            self.backend
            + ("+compile" if self.compile else "")
            + (f"-{self.tag}" if self.tag else "")
        )


def routes(recipe: Any, device: torch.device) -> list[Route]:
    """The candidates, torch first (ORT's spinning thread pool would slow torch after it); the
    compiled one's precision is settled once the eager ones are timed (``follow``)."""
    b = recipe.backend
    compiles = {False: [False], True: [True], "auto": [False, True]}[b.compile]
    torch_dtype, _ = runtime.resolve_precision(recipe.precision.dtype, "torch", device)
    out = [Route("torch", False, torch_dtype)] if False in compiles else []
    if torch_dtype == "bf16" and b.compile is not True:  # the alternatives (module docstring)
        # on a CPU only: a GPU's bf16 step is the faster, and fp32's memory might not fit
        if recipe.precision.dtype == "auto" and device.type == "cpu":
            out.append(Route("torch", False, "fp32", tag="fp32"))
        if recipe.precision.weights == "auto":
            out.append(Route("torch", False, "bf16", weights="bf16", tag="bf16w"))
    if True in compiles:
        out.append(Route("torch", True, torch_dtype))
    if b.name == "auto":
        ort_dtype, _ = runtime.resolve_precision(recipe.precision.dtype, "ort", device)
        out.append(Route("ort", False, ort_dtype))
    return out


def fastest_eager(result: dict[str, Any]) -> str | None:
    """The label of the timed eager torch candidate with the shortest median step (None: none
    ran)."""
    timed = result["backends"]
    eager = [
        label
        for label, b in timed.items()
        if b["backend"] == "torch" and not b["compile"] and "median_step_s" in b
    ]
    return min(eager, key=lambda label: timed[label]["median_step_s"]) if eager else None


def follow(route: Route, result: dict[str, Any], candidates: list[Route]) -> Route:
    """The compiled candidate in the precision of the fastest eager one, where one ran: that
    candidate, compiled (its tag names the precision it followed)."""
    best = fastest_eager(result)
    if not route.compile or best is None:
        return route
    eager = next(c for c in candidates if c.label == best)
    return replace(eager, compile=True)


def _build_model(
    loaded: LoadedRecipe, task: Any, tokenizer: Any, labels: Any, device: torch.device, attn: str
) -> Any:
    """The same model the PyTorch engine builds (keep the two in step)."""
    if isinstance(task, protocols.BuildsModel):  # the family's own (text-to-image: a UNet)
        return task.build_model(loaded, tokenizer, device)  # the run's build rebinds the task
    vocab = hf_config.vocabulary(task, tokenizer)
    model = models.build_model(
        loaded,
        task.auto_class,
        vocab,
        labels,
        attn=attn,
        config=hf_config.composed_config(loaded, task, vocab),
    )
    if isinstance(task, protocols.PreparesModel):
        task.prepare_model(model, tokenizer)
    if loaded.recipe.adapter is not None:
        model = models.apply_adapter(model, loaded.recipe.adapter, task)
    return model


def _time_route(
    route: Route,
    loaded: LoadedRecipe,
    task: Any,
    tokenizer: Any,
    labels: list[str] | None,
    encoded: Any,
    device: torch.device,
    build_optimizer: Callable[..., Any],
    scratch: Path,
    widths: list[int],
    warm: bool = False,
) -> list[float]:
    """Wall time of each of ``PROBE_STEPS`` optimizer steps (one micro-batch each); the width
    of each batch (tokens per row after padding) is appended to ``widths``. ``warm``: the same
    batches run once untimed first (``choose``)."""
    r = loaded.recipe
    backend = wrapper(route.backend, r.backend, compile=route.compile)
    attn = backend.attn_implementation(device, route.dtype)
    model = _build_model(loaded, task, tokenizer, labels, device, attn)
    module = models.TaskModule(model, task).to(device)
    # precision.weights: a bf16 copy trains, the optimizer steps the masters (as the engine)
    copy = master_weights.Bf16Copy(model) if route.weights == "bf16" else None
    trained = module if copy is None else models.TaskModule(copy.copy, task)
    wrapped = backend.wrap(trained, scratch / route.label)
    wrapped.train()
    outer = getattr(backend, "outer", None)
    forward = outer(wrapped) if outer is not None else wrapped
    params = [p for p in module.parameters() if p.requires_grad]
    optimizer = build_optimizer(params, r, device)
    padding = batches.Padding.of(r.data)

    def step(epoch: int, rows: Any) -> int:
        """One optimizer step on the task's collate of ``rows``; the batch's width."""
        batch = task.cut(task.collate(rows, epoch, r.training.seed), padding)
        inputs = {
            k: torch.from_numpy(v).to(device) for k, v in batch.items() if not k.startswith("_")
        }
        with runtime.autocast(route.dtype, device):  # the route's precision, as the run's
            if isinstance(task, protocols.RunsOutside):  # as the engine's step (its _call)
                inputs = task.outside_inputs(inputs)
            if isinstance(task, protocols.ScoresOutside):  # the engine's step: loss outside
                loss, _ = task.outside_loss(forward(**task.module_inputs(inputs)), inputs)
            else:
                loss, _ = forward(**inputs)
        loss.backward()
        if copy is not None:
            copy.collect_grads()
        backend.after_step(wrapped)
        if r.training.max_grad_norm:
            torch.nn.utils.clip_grad_norm_(params, r.training.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if copy is not None:
            copy.update()
        float(loss)  # wait for the step to finish (a no-op on CPU)
        ids = batch.get("input_ids")  # an image or a clip is one "token", as the loop counts
        return int(ids.shape[1]) if ids is not None else 1

    times: list[float] = []
    for timed in (False, True) if warm else (True,):
        # the batches the run will see, the same each pass: the task's collate, then cut to
        # data.padding (a probe of max_length batches would time a 3x longer step on short
        # texts than the run then takes)
        rows = batches.train_batches(
            encoded,
            r.training.batch_size,
            r.training.seed,
            r.data.shuffle,
            group_by_length=r.data.group_by_length,
        )
        for _ in range(PROBE_STEPS):
            t0 = time.perf_counter()
            width = step(*next(rows))
            if timed:
                times.append(time.perf_counter() - t0)
                widths.append(width)
    return times


def _figures(route: Route, times: list[float], widths: list[int], steps: int) -> dict[str, Any]:
    median = statistics.median(times[1:])
    one_off = max(times[0] - median, 0.0) if pays_once(route) else 0.0
    return {
        **_entry(route),
        "first_step_s": round(times[0], 4),
        "step_times_s": [round(t, 4) for t in times[1:]],
        "median_step_s": round(median, 4),
        "one_off_s": round(one_off, 3),
        "estimated_total_s": round(one_off + median * steps, 3),
        "sequence_lengths": widths,
    }


def pays_once(route: Route) -> bool:
    """Whether the route's first step does work the run pays again: ORT's export, a compile
    (an eager torch first step only warms the process: module docstring)."""
    return route.backend != "torch" or route.compile


def _entry(route: Route) -> dict[str, Any]:
    entry = {"backend": route.backend, "compile": route.compile, "dtype": route.dtype}
    return entry if route.weights == "fp32" else {**entry, "weights": route.weights}


def compile_skip(eager: dict[str, Any] | None, known_s: float | None, steps: int) -> str | None:
    """Why the compiled candidate is not worth probing (None: probe it); module docstring."""
    if eager is None or "median_step_s" not in eager:
        return "eager torch did not run, so the compile cannot be weighed"
    expected = known_s if known_s is not None else UNKNOWN_COMPILE_S
    budget = MAX_COMPILE_SHARE * eager["median_step_s"] * steps
    if expected <= budget:
        return None
    source = "measured last time" if known_s is not None else "assumed for an unmeasured model"
    return (
        f"the run is too short: a compile of ~{expected:.0f} s ({source}) is more than "
        f"{MAX_COMPILE_SHARE:.0%} of eager torch's estimated {eager['median_step_s'] * steps:.0f} s "
        f"for {steps} steps"
    )


def _skip(route: Route, recipe: Any, result: dict[str, Any], steps: int, key: str) -> str | None:
    """Why ``route`` is not probed: not installed, or a compile the run cannot pay back."""
    if route.backend == "ort":
        return ort_training.absent()
    if route.compile and recipe.backend.compile == "auto":
        known = compiled.known_compile_s(key)
        best = fastest_eager(result)
        return compile_skip(result["backends"][best] if best else None, known, steps)
    return None


def _probe_one(
    route: Route, args: tuple, result: dict[str, Any], steps: int, key: str, warm: bool
) -> None:
    """Time one route into ``result["backends"][label]`` (or record why it did not run);
    ``warm``: after a pass over the same batches (``_time_route``)."""
    entry = _entry(route)
    skip = _skip(route, args[0].recipe, result, steps, key)
    if skip is not None:
        result["backends"][route.label] = {**entry, "skipped": skip}
        log.info("auto: %s not probed: %s", route.label, skip)
        return
    widths: list[int] = []
    try:
        times = _time_route(route, *args, widths=widths, warm=warm)  # type: ignore[misc]
    except (BackendError, torch.OutOfMemoryError) as err:  # ORT cannot run it; it does not fit
        why = str(err).partition("\n")[0]
        result["backends"][route.label] = {**entry, "error": why}
        log.info("auto: %s cannot run this model (%s)", route.label, why)
        return
    finally:
        if route.compile:
            torch._dynamo.reset()  # drop the probe model's graphs (the run compiles its own)
        gc.collect()
    figures = result["backends"][route.label] = _figures(route, times, widths, steps)
    if route.compile:
        compiled.remember_compile_s(key, figures["one_off_s"])


def choose(
    loaded: LoadedRecipe,
    task: Any,
    tokenizer: Any,
    labels: list[str] | None,
    encoded: Any,
    device: torch.device,
    build_optimizer: Callable[..., Any],
    steps: int,
) -> tuple[tuple[str, bool], dict[str, Any]]:
    """The chosen route's (backend name, compile) and the probe's record for summary.json."""
    rng = checkpoint.rng_state()
    result: dict[str, Any] = {
        "steps": PROBE_STEPS,
        "timed_from_step": 2,
        "run_steps": steps,
        "backends": {},
    }
    candidates = routes(loaded.recipe, device)
    try:
        with tempfile.TemporaryDirectory(prefix="ortft-probe-") as scratch:
            args = (loaded, task, tokenizer, labels, encoded, device, build_optimizer)
            warmed: set[str] = set()  # the precisions an eager candidate warmed (docstring)
            for candidate in candidates:
                route = follow(candidate, result, candidates)
                key = compiled.route_key(loaded.recipe, device, route.dtype)
                warm = not pays_once(route) and route.dtype not in warmed
                if warm:
                    warmed.add(route.dtype)
                _probe_one(route, (*args, Path(scratch)), result, steps, key, warm)
    finally:
        checkpoint.set_rng_state(rng)
    timed = {n: b for n, b in result["backends"].items() if "estimated_total_s" in b}
    if not timed:
        raise BackendError("backend.name=auto: no route could run this model")
    label = min(timed, key=lambda n: timed[n]["estimated_total_s"])
    best = timed[label]
    weights = best.get("weights", "fp32")
    result.update(
        chosen=best["backend"],
        route=label,
        compile=best["compile"],
        dtype=best["dtype"],
        weights=weights,
    )
    log.info("backend: auto chose %s %s (%s)", label, _precision(best), _why(result, steps))
    return (best["backend"], best["compile"]), result


def _why(result: dict[str, Any], steps: int) -> str:
    parts = []
    for label, b in result["backends"].items():
        if "estimated_total_s" in b:
            one_off = f" + {b['one_off_s']:.1f} s once" if b["one_off_s"] >= 0.05 else ""
            parts.append(
                f"{label} {_precision(b)} {b['median_step_s'] * 1000:.0f} ms/step{one_off} "
                f"= {b['estimated_total_s']:.0f} s"
            )
        else:
            parts.append(
                f"{label} not probed ({b['skipped']})" if "skipped" in b else f"{label} failed"
            )
    return f"probe, {PROBE_STEPS} steps each; estimated over {steps} steps: " + ", ".join(parts)


def _precision(b: dict[str, Any]) -> str:
    return b["dtype"] + (" (bf16 weights)" if b.get("weights") == "bf16" else "")


def precision_reason(result: dict[str, Any], native: str) -> str | None:
    """Why the probe's chosen precision differs from ``native`` (None: it does not)."""
    if result["dtype"] == native and result["weights"] == "fp32":
        return None
    chosen = result["backends"][result["route"]]
    ms = chosen["median_step_s"] * 1000
    others = [
        f"{label} {_precision(b)} {b['median_step_s'] * 1000:.0f}"
        for label, b in result["backends"].items()
        if "median_step_s" in b and b is not chosen
    ]
    return (
        f"auto: the probe timed {_precision(chosen)} fastest on this model "
        f"({ms:.0f} ms/step; " + ", ".join(others) + " ms/step)"
    )
