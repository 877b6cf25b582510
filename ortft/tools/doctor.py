"""``ortft doctor``: check this machine against the known-good stack; a report for bug reports.

The stack is the active profile's (``ort`` where onnxruntime-training is installed, else
``current``: ortft.env.profiles), its versions read from that profile's lock file. Each line is
ok / info / warn / fail, and every line that is not ok or info carries the exact command that
fixes it. ``fail`` means the profile cannot work here (exit code 1); ``warn`` means it should
work but the combination is untested; ``info`` is context (an absent optional extra, no GPU on a
CPU machine, a route the profile does not have: ``ort`` on the current profile).

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
from ortft.env import hardware, ort_training, profiles
from ortft.tools import route_advice
from ortft.tools.doctor_verdicts import (
    CONFLICTING_ORT,
    DATA_PACKAGES,
    EXT_FIX,
    EXTRAS,
    FAIL,
    GPU_PROFILE_FIX,
    INFO,
    LOCKED_FEATURES,
    OK,
    ORT_CPU,
    ORT_MAX_IR_VERSION,
    STACKS,
    WARN,
    Check,
    Stack,
    bf16_check,
    check_platform,
    check_versions,
    found_routes,
    fused_ops_check,
    gpu_allocator_check,
    gpu_verdict,
    headline,
    load_stack,
    profile_check,
    provider_check,
    release,
    route_checks,
    verdict_line,
)

# The providers ortft runs on; ORT lists others (Azure, TensorRT...) that it never asks for.
USED_PROVIDERS = ("CPUExecutionProvider", "CUDAExecutionProvider")

# --------------------------------------------------------------------------- the live machine


def live_stack() -> Stack:
    """This machine's profile and its lock's pins."""
    return load_stack(profiles.active(), (sys.version_info.major, sys.version_info.minor))


def gather_versions() -> dict[str, str | None]:
    stacks = [name for names in STACKS.values() for name in names]
    names = [*dict.fromkeys(stacks), ORT_CPU, *CONFLICTING_ORT, *LOCKED_FEATURES, *EXTRAS]
    names += [*DATA_PACKAGES, "numpy", "protobuf"]
    found: dict[str, str | None] = {}
    for name in names:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def cpu_model() -> str:
    """/proc/cpuinfo's model name, else what ``platform`` knows."""
    name = platform.processor() or platform.machine()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return name


def _cpu() -> str:
    name = cpu_model()
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{name}, {usable} usable cores"


def _short(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[-1] if text else ''}"


def probe_runtime(stack: Stack, fix: bool = False) -> list[Check]:
    """Import torch / onnxruntime / ORTModule and look at what they can do; then which routes
    can run. Never raises."""
    checks: list[Check] = []
    # torch and onnxruntime print banners on import (CUDA_HOME, cudart); keep stdout clean.
    with contextlib.redirect_stdout(sys.stderr), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _quiet_cpp_extension_import()
        checks += _probe_torch(stack)
        checks += _probe_ort(stack)
        if stack.ort:  # torch-ort's extensions live inside onnxruntime.training
            checks += _probe_extensions(fix, stack)
            checks += _probe_cuda_extensions()
        checks += _probe_onnx(stack)
        checks += route_checks(stack, found_routes(checks))
    return checks


def _quiet_cpp_extension_import() -> None:
    """Import torch.utils.cpp_extension with its stderr swallowed: on a machine without a CUDA
    toolkit it prints "No CUDA runtime is found, using CUDA_HOME=..." at import, which ORTModule's
    import then triggers. That line is no finding of ours (the gpu line says what torch sees).
    Any import error is left for the probes below to report."""
    with contextlib.suppress(Exception), contextlib.redirect_stderr(io.StringIO()):
        import torch.utils.cpp_extension  # noqa: F401


def _probe_torch(stack: Stack) -> list[Check]:
    try:
        import torch
    except Exception as err:
        fix = f"{stack.pin('torch')} && {EXT_FIX}" if stack.ort else stack.pin("torch")
        return [Check("torch import", FAIL, _short(err), fix)]
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


def _reinstall_ort(stack: Stack) -> str:
    """The command that puts the profile's onnxruntime back."""
    if stack.ort:
        dist = (ort_training.installed() or ("onnxruntime-training",))[0]  # -cpu on 3.12
        want = stack.want("onnxruntime-training")
    else:
        dist, want = "onnxruntime", stack.want("onnxruntime")
    return f"pip install --force-reinstall {dist}" + (f"=={want}" if want else "")


def _probe_ort(stack: Stack | None = None) -> list[Check]:
    stack = stack or live_stack()
    fix = _reinstall_ort(stack)
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
    # the CUDA provider's libraries are the ort profile's CUDA 11.8 ones (make setup GPU=1)
    probed = USED_PROVIDERS if stack.ort else USED_PROVIDERS[:1]
    gpu = _gpu_visible()
    checks += [_probe_provider(n, gpu, stack) for n in providers if n in probed]
    return checks + (_probe_ort_training(fix) if stack.ort else [])


def _probe_ort_training(fix: str) -> list[Check]:
    """ORTModule (backend.name=ort) and the on-device API (ort-ondevice) import."""
    try:
        from onnxruntime.training.ortmodule import ORTModule  # noqa: F401
    except Exception as err:
        checks = [Check("ORTModule import", FAIL, _short(err), fix)]
    else:
        checks = [Check("ORTModule import", OK, "onnxruntime.training.ortmodule.ORTModule")]
    try:
        from onnxruntime.training.api import Module  # noqa: F401
    except Exception as err:
        return [*checks, Check("on-device training import", FAIL, _short(err), fix)]
    return [*checks, Check("on-device training import", OK, "onnxruntime.training.api.Module")]


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


def _probe_provider(provider: str, gpu_visible: bool, stack: Stack | None = None) -> Check:
    """Whether a listed provider can load here: ldd of its library, with the GPU profile's
    CUDA 11.8 folders first on the search path as the preload puts them in the process.
    (ORT lists every provider it was built with, whether it loads or not.)"""
    from ortft.env import cudalibs

    profile = cudalibs.installed()
    name, library = provider_library(provider)
    reinstall = _reinstall_ort(stack or live_stack())
    if library is None:
        value = f"{provider} is listed but its library is not in onnxruntime/capi"
        return Check(name, FAIL, value, reinstall)
    try:
        missing = cudalibs.unresolved(library, cudalibs.lib_dirs() if profile else [])
    except cudalibs.CudaLibsError as err:
        return Check(name, FAIL, str(err), "apt-get install libc-bin")
    check = provider_check(name, library.name, missing, gpu_visible, profile, reinstall)
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


def _probe_extensions(fix: bool, stack: Stack) -> list[Check]:
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
        lock = f"pip install -r {stack.lock or 'requirements/lock.txt'}"
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
        return [Check("ORTModule extensions", FAIL, value, f"{stack.pin('torch')} && {EXT_FIX}")]
    return [Check("ORTModule extensions", OK, f"{', '.join(state.present)} in {where}")]


def _probe_onnx(stack: Stack | None = None) -> list[Check]:
    stack = stack or live_stack()
    try:
        import onnx
    except Exception as err:
        return [Check("onnx import", FAIL, _short(err), stack.pin("onnx"))]
    ir = int(onnx.IR_VERSION)
    value = f"writes IR {ir}; newest opset {onnx.defs.onnx_opset_version()}"
    if not stack.ort:  # the onnxruntime of the current lock reads what its onnx writes
        return [Check("onnx IR", OK, value)]
    ort = ".".join(str(n) for n in release(stack.want("onnxruntime-training"))[:2]) or "training"
    value += f" (onnxruntime {ort} runs opsets <= 21)"
    if ir > ORT_MAX_IR_VERSION:
        value += f"; onnxruntime {ort} loads IR <= {ORT_MAX_IR_VERSION}"
        return [Check("onnx IR", FAIL, value, stack.pin("onnx"))]
    return [Check("onnx IR", OK, value)]


# --------------------------------------------------------------------------- report


def collect(
    fix: bool = False, versions: dict[str, str | None] | None = None, stack: Stack | None = None
) -> list[Check]:
    versions = gather_versions() if versions is None else versions
    stack = stack or live_stack()
    checks = [Check("ortft", INFO, f"{__version__} ({sys.prefix})")]
    checks.append(profile_check(stack, ort_training.installed()))
    python = (sys.version_info.major, sys.version_info.minor)
    checks += check_platform(python, platform.system(), platform.machine(), stack.profile)
    checks.append(Check("cpu", INFO, _cpu()))
    checks += check_versions(versions, stack)
    checks += probe_runtime(stack, fix=fix)
    checks += route_advice.advice(cpu_model(), hardware.cpu_flags())
    for name in ("numpy", "protobuf"):
        checks.append(Check(name, INFO, versions.get(name) or "not installed"))
    return _in_report_order(checks)


REPORT_ORDER = [
    "ortft",
    "profile",
    "python",
    "os",
    "cpu",
    "torch",
    "torch import",
    "torch build",
    "gpu",
    "onnxruntime",
    "onnxruntime-training",
    "onnxruntime import",
    "execution providers",
    "gpu provider",
    "CPU provider",
    "CUDA provider",
    "ORTModule import",
    "on-device training import",
    "ORTModule extensions",
    "CUDA extensions",
    "torch-ort",
    "onnx",
    "onnx import",
    "onnx IR",
    "transformers",
    "tensorboard",
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


def render(checks: list[Check], stack: Stack | None = None) -> str:
    stack = stack or live_stack()
    width = max(len(c.name) for c in checks) + 2
    lines = [headline(stack)]
    for c in checks:
        lines.append(f"{c.verdict:<5} {c.name:<{width}}{c.value}")
        if c.fix and c.verdict != OK:
            lines.append(f"{'':<6}{'':<{width}}fix: {c.fix}")
    counts = summary(checks)
    verdict = verdict_line(stack, bool(counts[FAIL]))
    lines.append(
        f"summary: {counts[OK]} ok, {counts[INFO]} info, {counts[WARN]} warn, "
        f"{counts[FAIL]} fail: {verdict}"
    )
    return "\n".join(lines) + "\n"


def main(as_json: bool = False, fix: bool = False) -> int:
    stack = live_stack()
    checks = collect(fix=fix, stack=stack)
    code = exit_code(checks)
    if as_json:
        report: dict[str, Any] = {
            "ortft": __version__,
            "exit_code": code,
            "summary": summary(checks),
            "profile": stack.profile,
            "lock": str(stack.lock) if stack.lock else None,
            "known_good": stack.known_good(),
            "checks": [c.as_dict() for c in checks],
        }
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
    else:
        sys.stdout.write(render(checks, stack))
    sys.stdout.flush()
    return code
