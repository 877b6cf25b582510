"""This machine's measured matmul limit: the dense GEMM rate torch reaches in fp32 and bf16 at
the shapes a model's training step runs, and at a large square, cached per machine.

A transformer layer's projections (attention's Q, K, V and output, the MLP's up and down) are
each ``nn.Linear``: ``Y = X·Wᵀ`` with ``X`` of ``tokens × in`` and ``W`` stored ``out × in``; a
training step runs three GEMMs per projection, in the layouts autograd runs them: the forward
``(tokens, in, out)`` (``Wᵀ`` a transposed view), the input's gradient ``dX = dY·W``
``(tokens, out, in)`` and the weight's gradient ``dW = dYᵀ·X`` ``(out, tokens, in)`` (``dYᵀ`` a
transposed view); ``m, k, n`` of an ``m×k · k×n`` product, ``2·m·k·n`` FLOPs. The limit at those shapes is the
rate the step's GEMM mix reaches when every GEMM runs at its own measured best:
``Σ FLOPs / Σ (FLOPs / rate)``. Attention's score products (batched ``length × head × length``)
and the embeddings are not in the mix.

Each GEMM is timed after a warm-up, in 10 repeats of a loop of about 2 ms (one call at least); its rate is the
best repeat (an achievable rate, not a typical one: on a shared machine short loops catch the
moments the cores are free). Results are cached in
``${ORTFT_CACHE:-~/.cache/ortft}/limit/<key>.json``, the key being the device's model, the thread
count and the torch version; a shape measured before is not measured again, and measuring again
(``refresh``) keeps the better of the old and new rate, so a measurement taken on a busy machine
is replaced by a quieter one, never the other way round.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import platform
import statistics
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SQUARE = 2048  # the large square, the shape a datasheet-style peak is usually quoted at
TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
BF16_FLAGS = ("amx_bf16", "avx512_bf16")  # /proc/cpuinfo flags of CPUs with bf16 matmul units
LOOP_S = 0.002  # each timed repeat runs the GEMM for about this long (one call at least)


@dataclass(frozen=True)
class Gemm:
    """One ``m×k · k×n`` product, run ``count`` times per layer per step; ``a_t`` / ``b_t``: that
    operand is a transposed view (stored ``k×m`` / ``n×k``), as autograd passes it."""

    label: str
    m: int
    k: int
    n: int
    count: int = 1
    a_t: bool = False
    b_t: bool = False

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.k * self.n

    @property
    def key(self) -> str:
        layout = ("T" if self.a_t else "N") + ("T" if self.b_t else "N")
        return f"{self.m}x{self.k}x{self.n}" + ("" if layout == "NN" else f"-{layout}")


def layer_gemms(hidden: int, intermediate: int, tokens: int) -> list[Gemm]:
    """The GEMMs of one transformer layer's projections in a training step over ``tokens``
    positions (rows × length of a micro-batch): forward, input gradient, weight gradient."""
    projections = [
        ("qkvo", hidden, hidden, 4),  # attention's Q, K, V and output: 4 alike
        ("ffn-up", hidden, intermediate, 1),
        ("ffn-down", intermediate, hidden, 1),
    ]
    out = []
    for name, d_in, d_out, count in projections:
        out += [
            Gemm(f"{name} fwd", tokens, d_in, d_out, count, b_t=True),
            Gemm(f"{name} dX", tokens, d_out, d_in, count),
            Gemm(f"{name} dW", d_out, tokens, d_in, count, a_t=True),
        ]
    return out


def dims(config: Any) -> tuple[int, int]:
    """(hidden, intermediate) of a transformers config; GPT-2's ``n_inner`` None is 4 × hidden."""
    hidden = int(config.hidden_size)
    inner = getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None)
    return hidden, int(inner or 4 * hidden)


def mix_rate(gemms: Iterable[Gemm], rates: dict[str, float]) -> float:
    """The rate of the step's GEMM mix with each at its measured rate: Σ FLOPs / Σ time."""
    gemms = list(gemms)
    work = sum(g.flops * g.count for g in gemms)
    return work / sum(g.flops * g.count / rates[g.key] for g in gemms)


def cpu_model() -> str:
    """/proc/cpuinfo's model name (lscpu's "Model name"), else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def device_name(device: str) -> str:
    if device == "cuda":
        import torch

        return str(torch.cuda.get_device_name())
    return cpu_model()


def bf16_units(device: str) -> str | None:
    """What runs bf16 matmuls natively here, or None where nothing does (torch then converts)."""
    if device == "cuda":
        import torch

        return "GPU tensor cores" if torch.cuda.is_bf16_supported() else None
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return None
    found = [f for f in BF16_FLAGS if f in flags]
    return " and ".join(found) if found else None


def cache_key(device: str, name: str, threads: int, torch_version: str) -> dict[str, Any]:
    return {"device": device, "model": name, "threads": threads, "torch": torch_version}


def cache_path(key: dict[str, Any]) -> Path:
    base = Path(os.environ.get("ORTFT_CACHE") or Path.home() / ".cache" / "ortft")
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return base / "limit" / f"{digest}.json"


def _read(path: Path, key: dict[str, Any]) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    # a hash collision or a hand-edited file: a cache for another machine is no cache
    return data.get("rates", {}) if data.get("key") == key else {}


def _write(path: Path, key: dict[str, Any], rates: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"key": key, "rates": rates}, indent=1, sort_keys=True))
    tmp.replace(path)  # atomic: a concurrent bench reads the old file or the new one


def time_gemm(g: Gemm, dtype: str, device: str, repeats: int) -> dict[str, Any]:
    """The best and median FLOP/s of ``repeats`` timed loops of ``g`` after one warm-up loop."""
    import torch

    tdtype = getattr(torch, TORCH_DTYPES[dtype])
    a = torch.randn(g.k, g.m, device=device).t() if g.a_t else torch.randn(g.m, g.k, device=device)
    b = torch.randn(g.n, g.k, device=device).t() if g.b_t else torch.randn(g.k, g.n, device=device)
    a, b = a.to(tdtype), b.to(tdtype)  # .to keeps a transposed view's strides
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def loop(reps: int) -> float:
        sync()
        t0 = time.perf_counter()
        for _ in range(reps):
            torch.mm(a, b)
        sync()
        return time.perf_counter() - t0

    one = loop(1)  # the first call also pays the library's set-up (packing, JIT kernels)
    reps = max(1, math.ceil(LOOP_S / max(min(loop(1) for _ in range(3)), 1e-7)))
    loop(reps)  # warm-up at the timed length
    rates = [g.flops * reps / loop(reps) for _ in range(repeats)]
    return {
        "flops": max(rates),
        "median_flops": statistics.median(rates),
        "first_call_s": one,
        "loop": reps,
        "repeats": repeats,
        "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "load_avg": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
    }


def measure(
    gemms: list[Gemm],
    device: str,
    threads: int,
    dtypes: Iterable[str] = ("fp32", "bf16"),
    repeats: int = 10,
    refresh: bool = False,
    square: int = SQUARE,
) -> dict[str, Any]:
    """The limit per dtype at ``gemms``' shapes and at ``square``³, from the cache where it holds
    them (``refresh``: measure every one again and keep the better rate)."""
    import torch

    key = cache_key(device, device_name(device), threads, torch.__version__)
    path = cache_path(key)
    cached = _read(path, key)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    big = Gemm("square", square, square, square)
    out: dict[str, Any] = {}
    try:
        for dtype in dtypes:
            per = cached.setdefault(dtype, {})
            for g in {x.key: x for x in [*gemms, big]}.values():
                if g.key in per and not refresh:
                    continue
                new = time_gemm(g, dtype, device, repeats)
                old = per.get(g.key)
                per[g.key] = new if old is None or new["flops"] > old["flops"] else old
            rates = {k: v["flops"] for k, v in per.items()}
            out[dtype] = {
                "flops": mix_rate(gemms, rates) if gemms else None,
                "square_flops": rates[big.key],
                "gemms": {g.label: {"shape": g.key, "flops": rates[g.key]} for g in gemms},
            }
    finally:
        torch.set_num_threads(before)
    _write(path, key, cached)
    units = bf16_units(device)
    return {
        **key,
        "cache": str(path),
        "bf16_units": units or "no bf16 matmul units (torch's bf16 rate is reported as it is)",
        "square": square,
        "dtypes": out,
        "how": f"torch.mm, best of {repeats} timed loops of ~{LOOP_S * 1000:.0f} ms after a "
        f"warm-up, on {threads} thread(s); the limit is Σ FLOPs / Σ (FLOPs / rate) over the "
        "step's projection GEMMs (forward, input gradient, weight gradient)",
    }


MODES = ("cached", "refresh", "off")
FORMULA = (
    "achieved FLOP/s (the MFU numerator / the timed steps' time) / this machine's measured "
    "torch matmul rate in the dtype the route ran, at the model's projection GEMMs (forward, "
    "input and weight gradients) for the mean micro-batch that ran (ortft.tools.limit; cached "
    "per device model, thread count and torch version)"
)


def report(measured: dict[str, Any] | None) -> dict[str, Any]:
    """The bench JSON's ``limit`` (None: off, or no FLOP count) and its formula."""
    return {"limit": measured, "limit_formula": FORMULA}


def check_mode(mode: str) -> None:
    from ortft.core.errors import UsageError

    if mode not in MODES:
        raise UsageError(f"--limit must be one of {', '.join(MODES)}, not {mode!r}")


def from_runs(
    runs: list[Any],
    recipe: Any,
    warmup: int,
    flop_model: Any,
    device: str,
    threads: int,
    mode: str,
) -> dict[str, Any] | None:
    """``ortft bench``'s limit at the shapes its good runs (``bench.RunResult``) ran: the
    trained model's saved config, ``recipe.training.batch_size`` rows × the mean length of the
    timed micro-batches; None without a FLOP count (nothing to divide)."""
    good = [x for x in runs if x.ok and x.out_dir and (x.out_dir / "final").is_dir()]
    if mode == "off" or flop_model is None or not good:
        return None
    lengths = [n for x in good for row in x.rows[warmup:] for n in row["batch_lengths"]]
    dtypes = [x.summary.precision.dtype for x in good if x.summary.precision]
    rows = recipe.training.batch_size
    return for_bench(good[0].out_dir / "final", rows, lengths, dtypes, device, threads, mode)


def for_bench(
    model_dir: Path,
    rows_per_micro: int,
    batch_lengths: list[int],
    dtypes: Iterable[str],
    device: str,
    threads: int,
    mode: str,
) -> dict[str, Any] | None:
    """``ortft bench``'s limit: the projection GEMMs of the trained model (its saved config) at
    ``rows_per_micro`` × the mean length the timed micro-batches ran, in each dtype a route ran
    (``benchmarks/limit.py`` gives fp32 and bf16 alike)."""
    import transformers

    if not batch_lengths:
        return None
    config = transformers.AutoConfig.from_pretrained(model_dir)
    hidden, inner = dims(config)
    tokens = rows_per_micro * round(statistics.mean(batch_lengths))
    wanted = list(dict.fromkeys(dtypes)) or ["fp32"]  # only what a route ran: each costs seconds
    t0 = time.perf_counter()
    result = measure(
        layer_gemms(hidden, inner, tokens), device, threads, wanted, refresh=mode == "refresh"
    )
    rates = ", ".join(f"{k} {v['flops'] / 1e9:.0f}" for k, v in result["dtypes"].items())
    logging.getLogger("ortft").info(
        "bench: limit (hidden %d, ffn %d, %d tokens): %s GFLOP/s (%.1f s; %s)",
        hidden,
        inner,
        tokens,
        rates,
        time.perf_counter() - t0,
        result["cache"],
    )
    return {**result, "tokens_per_micro_batch": tokens, "hidden": hidden, "intermediate": inner}


def add_shares(results: dict[str, Any], limit: dict[str, Any] | None) -> None:
    """Each route's achieved FLOP/s as a share of the limit in the dtype it ran (None without a
    FLOP count or a limit)."""
    for r in results.values():
        rate = (limit or {}).get("dtypes", {}).get(r.get("dtype"), {}).get("flops")
        for field in ("", "_padded"):
            achieved = r.get(f"flops_per_s{field}")
            r[f"limit_share{field}"] = achieved / rate if achieved and rate else None


def recipe_shape(loaded: Any) -> tuple[int, int, int]:
    """(hidden, intermediate, tokens per micro-batch) of a text recipe: the model's sizes
    (``model.from_config`` or the saved model's config.json) and ``batch_size × max_length``,
    the padded upper bound (``ortft bench`` uses the lengths its steps ran instead)."""
    r = loaded.recipe
    tokens = r.training.batch_size * r.data.max_length
    spec = r.model.from_config
    if spec is not None:
        return spec.hidden_size, spec.intermediate_size or 4 * spec.hidden_size, tokens
    import transformers

    config = transformers.AutoConfig.from_pretrained(loaded.resolve_path(r.model.name_or_path))
    return (*dims(config), tokens)
