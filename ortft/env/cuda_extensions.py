"""torch-ort's two CUDA extensions: the GPU allocator from PyPI wheels alone (no nvcc), and
fused_ops with a CUDA 12 toolkit that a person installs.

**torch_gpu_allocator.**
On a GPU, ORTModule imports ``torch_cpp_extensions.torch_gpu_allocator`` in every constructor
(onnxruntime 1.19.2, ``_graph_execution_manager.py``: ``_RuntimeOptions.use_external_gpu_allocator``
defaults to True whenever ``torch.cuda.is_available()``), so that ORT's CUDA provider allocates
through torch's caching allocator. Without the extension no ORTModule starts on a GPU.

The extension is a ``CUDAExtension`` with a single ``.cc`` source and no device code. torch's
``BuildExtension`` calls nvcc only for ``.cu`` sources (and checks nvcc's version only then), so
the host C++ compiler builds it, given:

- CUDA 12 runtime headers: ``nvidia-cuda-runtime-cu12`` (torch's own dependency). Its
  ``cuda_runtime_api.h`` includes ``crt/host_defines.h``, which that wheel lacks;
  ``nvidia-cuda-nvcc-cu12`` (22 MB: headers, ptxas, libnvvm; no nvcc) has ``crt/``.
- a link name for ``libcudart``: the wheel ships only ``libcudart.so.12``.
- ``CUDA_HOME`` pointing at a tree made of those two (:func:`assemble_cuda_home`). Set
  explicitly: torch's ``_find_cuda_home`` would otherwise take the ``nvcc`` on the PATH (a CUDA
  13.0 toolkit on these machines) and mix CUDA 13 headers into a cu12.4 torch extension.

The ``.so`` gets a RUNPATH to torch's ``lib/`` and the runtime wheel's ``lib/`` (relative to
where it lives), so ``ldd`` resolves ``libc10_cuda.so`` and ``libcudart.so.12`` without
``LD_LIBRARY_PATH``, and ``libcudart.so.12`` is a ``NEEDED`` entry (``--no-as-needed``: the code
calls no cudart function, so the linker would drop it), which makes the runtime it was built
for visible to ``readelf -d``. :func:`inspect` checks those, in a fresh Python.

**fused_ops** (``.cu`` multi-tensor kernels) serves only ``onnxruntime.training.optim``
(``FusedAdam``, behind ``optimizer.name: adamw_ort_fused``); nothing under ``ortmodule/`` imports
it. It needs nvcc of torch's CUDA major version (12), which PyPI does not have
(``nvidia-cuda-nvcc-cu12`` has no nvcc; the full one, ``nvidia-cuda-nvcc``, is CUDA 13), so it is
built only on request: :data:`FUSED_OPS_COMMAND`.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

NAME = "torch_gpu_allocator"
SOURCE = Path("cuda") / NAME  # inside onnxruntime's torch_cpp_extensions folder
RUNTIME_WHEEL = "nvidia-cuda-runtime-cu12"
HEADERS_WHEEL = "nvidia-cuda-nvcc-cu12"  # only for crt/: it has no nvcc
CUDART = "libcudart.so.12"
FUNCTIONS = (  # what the extension returns: addresses ORT's CUDA provider calls
    "gpu_caching_allocator_raw_alloc_address",
    "gpu_caching_allocator_raw_delete_address",
    "gpu_caching_allocator_empty_cache_address",
)


class CudaBuildError(RuntimeError):
    """A CUDA extension cannot be built here; the message says what to do."""


def source_dir(ext_dir: Path) -> Path | None:
    path = ext_dir / SOURCE
    return path if (path / "setup.py").is_file() else None


def _package_dir(module: str) -> Path | None:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def wheel_dirs() -> tuple[Path, Path]:
    """The two wheels' folders (``nvidia/cuda_runtime``, ``nvidia/cuda_nvcc``), or an error
    naming the missing one and the pin that brings it."""
    found = []
    for module, wheel in (
        ("nvidia.cuda_runtime", RUNTIME_WHEEL),
        ("nvidia.cuda_nvcc", HEADERS_WHEEL),
    ):
        try:
            path = _package_dir(module)
        except ModuleNotFoundError:
            path = None
        if path is None:
            raise CudaBuildError(
                f"{wheel} is not installed (torch_gpu_allocator is built from its headers); "
                "run `make setup`, or `pip install -r requirements/lock.txt`"
            )
        found.append(path)
    return found[0], found[1]


def wheel_versions() -> dict[str, str | None]:
    """The key input: which CUDA runtime the allocator is built against."""
    out: dict[str, str | None] = {}
    for wheel in (RUNTIME_WHEEL, HEADERS_WHEEL):
        try:
            out[wheel] = importlib.metadata.version(wheel)
        except importlib.metadata.PackageNotFoundError:
            out[wheel] = None
    return out


def assemble_cuda_home(dest: Path) -> Path:
    """A CUDA_HOME made of links into the two wheels: ``include/`` (runtime headers + ``crt/``)
    and ``lib64/libcudart.so`` (the link name the wheel lacks) -> its ``libcudart.so.12``."""
    runtime, nvcc = wheel_dirs()
    cudart = runtime / "lib" / CUDART
    if not cudart.is_file():
        raise CudaBuildError(f"{cudart} is missing: reinstall {RUNTIME_WHEEL} (make setup)")
    if not (nvcc / "include" / "crt" / "host_defines.h").is_file():
        raise CudaBuildError(f"{nvcc}/include/crt is missing: reinstall {HEADERS_WHEEL}")
    include, lib = dest / "include", dest / "lib64"
    include.mkdir(parents=True, exist_ok=True)
    lib.mkdir(parents=True, exist_ok=True)
    for wheel_include in (runtime / "include", nvcc / "include"):
        for item in sorted(wheel_include.iterdir()):
            if item.name in ("__init__.py", "__pycache__"):
                continue
            (include / item.name).symlink_to(item.resolve())
    for name in ("libcudart.so", CUDART):  # -lcudart (torch) and -l:libcudart.so.12 (ours)
        (lib / name).symlink_to(cudart.resolve())
    return dest


def build_env(cuda_home: Path, ext_dir: Path) -> dict[str, str]:
    """The environment for onnxruntime's own ``setup.py`` of the allocator."""
    import torch

    runtime, _ = wheel_dirs()
    if (torch.version.cuda or "").split(".")[0] != "12":
        raise CudaBuildError(
            f"torch {torch.__version__} is built for CUDA {torch.version.cuda}, not 12: the "
            "allocator is built against CUDA 12.4's runtime wheels; run `make setup` "
            "(the lock's torch 2.6.0)"
        )
    torch_lib = Path(torch.__file__).parent / "lib"
    rpath = ":".join(
        "$ORIGIN/" + os.path.relpath(path, ext_dir) for path in (torch_lib, runtime / "lib")
    )
    env = dict(os.environ)
    # both names: torch's _find_cuda_home reads CUDA_HOME, then CUDA_PATH, then the PATH's nvcc
    env.update(CUDA_HOME=str(cuda_home), CUDA_PATH=str(cuda_home))
    env["ONNXRUNTIME_ROCM_VERSION"] = ""  # the setup.py picks CUDA or ROCm by this alone
    # distutils adds LDFLAGS before the objects and libraries: --no-as-needed records cudart
    env["LDFLAGS"] = f"-Wl,--no-as-needed -l:{CUDART} -Wl,--as-needed -Wl,-rpath,{rpath}"
    env.pop("CUDA_INC_PATH", None)  # torch would add it to the include path
    return env


def build(ext_dir: Path, build_base: Path, run) -> Path:
    """Build the allocator into ``ext_dir``; ``run(cmd, cwd, env, what)`` runs (and logs) one
    command. onnxruntime's ``setup.py`` fills the ``.cc`` template in place, so it runs on a
    copy: the installed package stays as pip wrote it."""
    src = source_dir(ext_dir)
    if src is None:
        raise CudaBuildError(f"{ext_dir / SOURCE}/setup.py is missing: reinstall onnxruntime")
    work = build_base / NAME
    env = build_env(assemble_cuda_home(work / "cuda_home"), ext_dir)
    return _setup_py_build(src, ext_dir, work, env, run, f"ORTModule's GPU allocator ({NAME})")


def _setup_py_build(src: Path, ext_dir: Path, work: Path, env: dict, run, what: str) -> Path:
    """onnxruntime's ``setup.py build`` of one extension, on a copy of its folder (``src``) in
    ``work``; the ``.so`` it writes copied into ``ext_dir``."""
    shutil.copytree(src, work / "src")
    cmd = [sys.executable, "setup.py", "build", "--build-base", str(work / "build")]
    run(cmd, work / "src", env, what)
    built = sorted((work / "build").glob(f"lib.*/{src.name}*.so"))
    if not built:
        raise CudaBuildError(f"the {src.name} build wrote no .so under {work / 'build'}")
    dest = ext_dir / built[0].name
    shutil.copyfile(built[0], dest)
    return dest


# --------------------------------------------------------------------------- checks


def needed(so: Path) -> list[str]:
    """The ``NEEDED`` entries of ``readelf -d``."""
    out = subprocess.run(["readelf", "-d", str(so)], capture_output=True, text=True, check=True)
    return [
        line.split("[", 1)[1].rstrip("]").strip()
        for line in out.stdout.splitlines()
        if "(NEEDED)" in line
    ]


def resolved(so: Path) -> dict[str, str]:
    """What ``ldd`` resolves each library to (``not found`` kept as such), real paths."""
    out = subprocess.run(["ldd", str(so)], capture_output=True, text=True, check=True)
    found = {}
    for line in out.stdout.splitlines():
        name, sep, rest = line.strip().partition(" => ")
        if sep:
            target = rest.rsplit(" (", 1)[0].strip()
            found[name] = target if target == "not found" else os.path.realpath(target)
    return found


_PROBE = r"""
import ctypes, json, sys
import torch
from onnxruntime.training.ortmodule.torch_cpp_extensions import torch_gpu_allocator as ext

class Info(ctypes.Structure):
    _fields_ = [("fname", ctypes.c_char_p), ("fbase", ctypes.c_void_p),
                ("sname", ctypes.c_char_p), ("saddr", ctypes.c_void_p)]

libc = ctypes.CDLL(None)
out = {"module": ext.__file__, "functions": {}}
for name in json.loads(sys.argv[1]):
    info = Info()
    ok = libc.dladdr(ctypes.c_void_p(getattr(ext, name)()), ctypes.byref(info))
    out["functions"][name] = {
        "file": info.fname.decode() if ok and info.fname else None,
        "symbol": info.sname.decode() if ok and info.sname else None,
    }
print("ORTFT-PROBE " + json.dumps(out))
"""


def probe_addresses(timeout: float = 120) -> dict:
    """Import the extension after ``import torch`` in a fresh Python and ``dladdr`` the three
    addresses it returns: ``{"module": path, "functions": {name: {"file", "symbol"}}}``, or
    ``{"error": last line}`` when the import fails."""
    cmd = [sys.executable, "-c", _PROBE, json.dumps(list(FUNCTIONS))]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"importing {NAME} took more than {timeout:.0f} s"}
    for line in proc.stdout.splitlines():
        if line.startswith("ORTFT-PROBE "):
            return json.loads(line.removeprefix("ORTFT-PROBE "))
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    return {"error": lines[-1] if lines else f"exit code {proc.returncode}"}


def inspect(so: Path) -> list[str]:
    """Every way the built ``.so`` is not what ORTModule needs on a GPU; empty when it is."""
    import torch

    problems = []
    libs = needed(so)
    cudarts = [lib for lib in libs if lib.startswith("libcudart.so")]
    if cudarts != [CUDART]:
        problems.append(f"needs {cudarts or 'no libcudart'}, not {CUDART} (readelf -d {so})")
    torch_lib = os.path.realpath(Path(torch.__file__).parent / "lib")
    where = resolved(so).get("libc10_cuda.so", "not found")
    if os.path.dirname(where) != torch_lib:
        problems.append(f"libc10_cuda.so resolves to {where}, not torch's {torch_lib} (ldd {so})")
    probe = probe_addresses()
    if "error" in probe:
        problems.append(f"does not import after `import torch`: {probe['error']}")
    else:
        for name, info in probe["functions"].items():
            if info["file"] is None or os.path.realpath(info["file"]) != os.path.realpath(so):
                problems.append(f"{name}() points into {info['file']}, not the extension")
    return problems


# --------------------------------------------------------------------------- fused_ops

# V100 to H100: what torch 2.6's CUDA 12.4 and ORT's CUDA 11.8 build both run on. Without it
# torch builds for the visible GPU only, and the cache (keyed on versions, not on the GPU) would
# hand an A100 build to an H100 sharing the same ~/.cache ("no kernel image is available").
CUDA_ARCHS = "7.0;7.5;8.0;8.6;8.9;9.0"
FUSED_OPS_COMMAND = (
    "CUDA_HOME=/usr/local/cuda-12.4 .venv/bin/python -m ortft.env.extensions --fused-ops"
)


def nvcc_release(cuda_home: str) -> str:
    """``12.4`` from ``$CUDA_HOME/bin/nvcc --version``, or an error saying what is needed."""
    nvcc = Path(cuda_home) / "bin" / "nvcc"
    if not nvcc.is_file():
        raise CudaBuildError(f"{nvcc} not found: CUDA_HOME must be a CUDA 12.x toolkit")
    out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True).stdout
    match = re.search(r"release (\d+\.\d+)", out)
    release = match.group(1) if match else "unknown"
    if not release.startswith("12."):
        raise CudaBuildError(
            f"{nvcc} is CUDA {release}; fused_ops needs a CUDA 12.x nvcc, torch 2.6's major "
            "version (torch refuses another)"
        )
    return release


def build_fused_ops(ext_dir: Path, build_base: Path, run) -> Path:
    """fused_ops with the nvcc of ``$CUDA_HOME`` (set explicitly: never the PATH's nvcc, which
    on these machines is CUDA 13), on a copy of onnxruntime's sources, into ``ext_dir``."""
    src = ext_dir / "cuda" / "fused_ops"
    if not (src / "setup.py").is_file():
        raise CudaBuildError(f"{src}/setup.py is missing: reinstall onnxruntime-training")
    cuda_home = os.environ.get("CUDA_HOME", "")
    if not cuda_home:
        raise CudaBuildError(f"set CUDA_HOME to a CUDA 12.x toolkit: {FUSED_OPS_COMMAND}")
    nvcc_release(cuda_home)
    env = dict(os.environ, CUDA_PATH=cuda_home, ONNXRUNTIME_ROCM_VERSION="")
    env.setdefault("TORCH_CUDA_ARCH_LIST", CUDA_ARCHS)
    return _setup_py_build(src, ext_dir, build_base / "fused_ops", env, run, "fused_ops (nvcc)")
