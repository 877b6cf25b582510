"""``ortft doctor``: check this machine against the known-good stack; a report for bug reports.

Each line is ok / info / warn / fail, and every line that is not ok or info carries the exact
command that fixes it. ``fail`` means ONNX Runtime training cannot work here (exit code 1);
``warn`` means it should work but the combination is untested; ``info`` is context (an absent
optional extra, no GPU on a CPU machine).

The verdicts are pure functions in ``doctor_verdicts.py`` (the version verdicts of a
``{distribution: version}`` dict, :func:`check_versions`, so tests can patch versions); this
module gathers the facts from the live machine and writes the report. Everything that needs
torch or onnxruntime imported is gathered in :func:`probe_runtime` and never raises.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import io
import json
import os
import platform
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

from ortft import __version__
from ortft.env import hardware, ort_training
from ortft.tools.doctor_verdicts import (
    CONFLICTING_ORT,
    DATA_PACKAGES,
    EXT_FIX,
    EXTRAS,
    FAIL,
    GPU_PROFILE_FIX,
    INFO,
    KNOWN_GOOD,
    OK,
    ORT_CPU,
    ORT_MAX_IR_VERSION,
    WARN,
    Check,
    bf16_check,
    check_platform,
    check_versions,
    fused_ops_check,
    gpu_allocator_check,
    gpu_verdict,
    pin,
    provider_check,
)

# --------------------------------------------------------------------------- the live machine


def gather_versions() -> dict[str, str | None]:
    names = [*KNOWN_GOOD, ORT_CPU, *CONFLICTING_ORT, *EXTRAS, *DATA_PACKAGES, "numpy", "protobuf"]
    found: dict[str, str | None] = {}
    for name in names:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def _cpu() -> str:
    name = platform.processor() or platform.machine()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{name}, {usable} usable cores"


def _short(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[-1] if text else ''}"


def probe_runtime(fix: bool = False) -> list[Check]:
    """Import torch / onnxruntime / ORTModule and look at what they can do. Never raises."""
    checks: list[Check] = []
    # torch and onnxruntime print banners on import (CUDA_HOME, cudart); keep stdout clean.
    with contextlib.redirect_stdout(sys.stderr), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _quiet_cpp_extension_import()
        checks += _probe_torch()
        checks += _probe_ort()
        checks += _probe_extensions(fix)
        checks += _probe_cuda_extensions()
        checks += _probe_onnx()
    return checks


def _quiet_cpp_extension_import() -> None:
    """Import torch.utils.cpp_extension with its stderr swallowed: on a machine without a CUDA
    toolkit it prints "No CUDA runtime is found, using CUDA_HOME=..." at import, which ORTModule's
    import then triggers. That line is no finding of ours (the gpu line says what torch sees).
    Any import error is left for the probes below to report."""
    with contextlib.suppress(Exception), contextlib.redirect_stderr(io.StringIO()):
        import torch.utils.cpp_extension  # noqa: F401


def _probe_torch() -> list[Check]:
    try:
        import torch
    except Exception as err:
        return [Check("torch import", FAIL, _short(err), f"{pin('torch')} && {EXT_FIX}")]
    if torch.version.hip:
        build = f"ROCm {torch.version.hip} build"
    elif torch.version.cuda:
        build = f"CUDA {torch.version.cuda} build"
    else:
        build = "CPU build"
    checks = [Check("torch build", INFO, build)]
    try:
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        names = [torch.cuda.get_device_name(i) for i in range(count)]
    except Exception as err:
        return [*checks, Check("gpu", WARN, f"cannot query GPUs ({_short(err)})", "nvidia-smi")]
    if count:
        checks.append(Check("gpu", OK, f"{count}: {', '.join(names)}"))
        caps = [torch.cuda.get_device_capability(i) for i in range(count)]
    else:
        checks.append(Check("gpu", INFO, "none visible: training runs on the CPU"))
        caps = []
    return [*checks, bf16_check(hardware.cpu_bf16(), caps)]


def _gpu_visible() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


def _probe_ort() -> list[Check]:
    dist = (ort_training.installed() or ("onnxruntime-training",))[0]  # -cpu on Python 3.12
    fix = f"pip install --force-reinstall {dist}=={KNOWN_GOOD['onnxruntime-training']}"
    try:
        import onnxruntime as ort
    except Exception as err:
        return [Check("onnxruntime import", FAIL, _short(err), fix)]
    providers = ort.get_available_providers()
    checks = []
    if "CPUExecutionProvider" not in providers:
        checks.append(Check("execution providers", FAIL, ", ".join(providers) or "none", fix))
    else:
        checks.append(Check("execution providers", OK, ", ".join(providers)))
    gpu_providers = {"CUDAExecutionProvider", "ROCMExecutionProvider"}
    if _gpu_visible() and not gpu_providers & set(providers):
        value = "a GPU is visible but onnxruntime has no CUDA/ROCm provider: ORT would run on CPU"
        checks.append(Check("gpu provider", WARN, value, fix))
    checks += [_probe_provider(name, _gpu_visible()) for name in providers]
    try:
        from onnxruntime.training.ortmodule import ORTModule  # noqa: F401
    except Exception as err:
        checks.append(Check("ORTModule import", FAIL, _short(err), fix))
    else:
        checks.append(Check("ORTModule import", OK, "onnxruntime.training.ortmodule.ORTModule"))
    return checks


# --------------------------------------------------------------------------- GPU pieces
# (their verdicts: gpu_verdict, provider_check, cuda_extensions_check in doctor_verdicts.py)


def provider_library(provider: str) -> tuple[str, Any]:
    """The shared library an execution provider lives in: the CPU provider is inside the
    Python binding; the others are libonnxruntime_providers_<name>.so beside it."""
    from ortft.env import cudalibs

    if provider == "CPUExecutionProvider":
        spec = importlib.util.find_spec("onnxruntime")
        if spec is None or not spec.submodule_search_locations:
            return "CPU provider", None
        capi = Path(list(spec.submodule_search_locations)[0]) / "capi"
        found = sorted(capi.glob("onnxruntime_pybind11_state*.so"))
        return "CPU provider", found[0] if found else None
    short = provider.removesuffix("ExecutionProvider")
    return f"{short} provider", cudalibs.provider_library(short.lower())


def _probe_provider(provider: str, gpu_visible: bool) -> Check:
    """Whether a listed provider can load here: ldd of its library, with the GPU profile's
    CUDA 11.8 folders first on the search path as the preload puts them in the process.
    (ORT lists every provider it was built with, whether it loads or not.)"""
    from ortft.env import cudalibs

    profile = cudalibs.installed()
    name, library = provider_library(provider)
    if library is None:
        value = f"{provider} is listed but its library is not in onnxruntime/capi"
        return Check(name, FAIL, value, pin("onnxruntime-training"))
    try:
        missing = cudalibs.unresolved(library, cudalibs.lib_dirs() if profile else [])
    except cudalibs.CudaLibsError as err:
        return Check(name, FAIL, str(err), "apt-get install libc-bin")
    check = provider_check(name, library.name, missing, gpu_visible, profile)
    if check.verdict == OK and profile and provider == "CUDAExecutionProvider":
        check.value += f" (CUDA 11.8 from {cudalibs.root()})"
        if not cudalibs.loaded():  # doctor imported onnxruntime: the .pth hook should have run
            check.verdict = gpu_verdict(gpu_visible, profile)
            check.value += "; but nothing preloaded them into this process (ortft-cuda11.pth?)"
            check.fix = GPU_PROFILE_FIX
    return check


def _probe_cuda_extensions() -> list[Check]:
    """torch-ort's CUDA extensions, each on its own line: the GPU allocator (every ORTModule on
    a GPU) and fused_ops (only adamw_ort_fused). The CPU ones have their own line."""
    from ortft.env import cuda_extensions, cudalibs, extensions

    if extensions.extensions_dir() is None:
        return []  # the onnxruntime lines already say it is missing
    allocator_so, needed = extensions.built_file(cuda_extensions.NAME), None
    if allocator_so is not None:
        try:
            needed = cuda_extensions.needed(allocator_so)
        except (OSError, subprocess.CalledProcessError) as err:  # no readelf: say so, not crash
            return [
                Check(
                    "GPU allocator extension",
                    WARN,
                    f"readelf failed: {_short(err)}",
                    "apt-get install binutils",
                )
            ]
    allocator = gpu_allocator_check(needed, _gpu_visible(), cudalibs.installed())
    return [allocator, fused_ops_check(extensions.built_file("fused_ops") is not None)]


def _probe_extensions(fix: bool) -> list[Check]:
    from ortft.env import extensions

    try:
        state = extensions.status()
        if fix and not state.built and state.problem is None:
            extensions.ensure_built()
            state = extensions.status()
    except extensions.ExtensionError as err:
        value = f"--fix failed: {err}"
        return [Check("ORTModule extensions", FAIL, value, f"fix the cause above, then {EXT_FIX}")]
    except Exception as err:
        return [Check("ORTModule extensions", FAIL, _short(err), EXT_FIX)]
    if state.problem:
        lock = "pip install -r requirements/lock.txt"
        return [Check("ORTModule extensions", FAIL, state.problem, lock)]
    where = state.directory
    if state.stale:
        value = f"built for another torch/onnxruntime/python in {where}"
        return [Check("ORTModule extensions", FAIL, value, f"{EXT_FIX}  (rebuilds them)")]
    if state.missing:
        value = f"not built: {', '.join(state.missing)} missing in {where}"
        return [Check("ORTModule extensions", FAIL, value, f"{EXT_FIX}  (or `make setup`)")]
    problem = extensions.check_loads()
    if problem:
        value = f"built in {where} but do not load: {problem}"
        return [Check("ORTModule extensions", FAIL, value, f"{pin('torch')} && {EXT_FIX}")]
    return [Check("ORTModule extensions", OK, f"{', '.join(state.present)} in {where}")]


def _probe_onnx() -> list[Check]:
    try:
        import onnx
    except Exception as err:
        return [Check("onnx import", FAIL, _short(err), pin("onnx"))]
    ir = int(onnx.IR_VERSION)
    opset = onnx.defs.onnx_opset_version()
    value = f"writes IR {ir}; newest opset {opset} (onnxruntime 1.19 runs opsets <= 21)"
    if ir > ORT_MAX_IR_VERSION:
        value += f"; onnxruntime 1.19 loads IR <= {ORT_MAX_IR_VERSION}"
        return [Check("onnx IR", FAIL, value, pin("onnx"))]
    return [Check("onnx IR", OK, value)]


# --------------------------------------------------------------------------- report


def collect(fix: bool = False, versions: dict[str, str | None] | None = None) -> list[Check]:
    versions = gather_versions() if versions is None else versions
    checks = [Check("ortft", INFO, f"{__version__} ({sys.prefix})")]
    checks += check_platform(sys.version_info[:2], platform.system(), platform.machine())
    checks.append(Check("cpu", INFO, _cpu()))
    checks += check_versions(versions)
    checks += probe_runtime(fix=fix)
    for name in ("numpy", "protobuf"):
        checks.append(Check(name, INFO, versions.get(name) or "not installed"))
    return _in_report_order(checks)


REPORT_ORDER = [
    "ortft",
    "python",
    "os",
    "cpu",
    "torch",
    "torch import",
    "torch build",
    "gpu",
    "onnxruntime-training",
    "onnxruntime import",
    "execution providers",
    "gpu provider",
    "CPU provider",
    "CUDA provider",
    "ORTModule import",
    "ORTModule extensions",
    "CUDA extensions",
    "torch-ort",
    "onnx",
    "onnx import",
    "onnx IR",
    "transformers",
    "numpy",
    "protobuf",
]


def _in_report_order(checks: list[Check]) -> list[Check]:
    """Each package's runtime lines next to its version line; extras and data last."""
    rank = {name: i for i, name in enumerate(REPORT_ORDER)}
    return sorted(checks, key=lambda c: rank.get(c.name, len(rank)))


def exit_code(checks: list[Check]) -> int:
    return 1 if any(c.verdict == FAIL for c in checks) else 0


def summary(checks: list[Check]) -> dict[str, int]:
    return {v: sum(c.verdict == v for c in checks) for v in (OK, INFO, WARN, FAIL)}


def render(checks: list[Check]) -> str:
    width = max(len(c.name) for c in checks) + 2
    lines = [f"ortft doctor (known-good: {', '.join(f'{k}=={v}' for k, v in KNOWN_GOOD.items())})"]
    for c in checks:
        lines.append(f"{c.verdict:<5} {c.name:<{width}}{c.value}")
        if c.fix and c.verdict != OK:
            lines.append(f"{'':<6}{'':<{width}}fix: {c.fix}")
    counts = summary(checks)
    verdict = "ORT training cannot work here" if counts[FAIL] else "ORT training should work here"
    lines.append(
        f"summary: {counts[OK]} ok, {counts[INFO]} info, {counts[WARN]} warn, "
        f"{counts[FAIL]} fail: {verdict}"
    )
    return "\n".join(lines) + "\n"


def main(as_json: bool = False, fix: bool = False) -> int:
    checks = collect(fix=fix)
    code = exit_code(checks)
    if as_json:
        report: dict[str, Any] = {
            "ortft": __version__,
            "exit_code": code,
            "summary": summary(checks),
            "known_good": KNOWN_GOOD,
            "checks": [c.as_dict() for c in checks],
        }
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
    else:
        sys.stdout.write(render(checks))
    sys.stdout.flush()
    return code
