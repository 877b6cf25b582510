"""The CUDA 11.8 libraries that onnxruntime-training 1.19.2's CUDA provider links against.

PyPI's onnxruntime-training 1.19.2 is a CUDA 11.8 build: ``libonnxruntime_providers_cuda.so``
needs ``libcudart.so.11.0``, ``libcublas(Lt).so.11``, ``libcudnn.so.8``, ``libcurand.so.10`` and
``libcufft.so.10``, while torch 2.6.0 brings CUDA 12.4's (``.so.12``, cuDNN 9). The GPU profile
(``make setup GPU=1``) installs NVIDIA's ``nvidia-*-cu11`` wheels from requirements/gpu-cu11.txt
with ``pip --target <venv>/cuda11``, not into site-packages: the cu11 and cu12 wheels share
folder names (``nvidia/cublas/include/...``), so installed side by side the later one would
overwrite the other's headers and RECORD-listed files.

Nothing on the loader's search path points there, so :func:`preload` loads each library by its
full path (RTLD_GLOBAL, dependencies first) before onnxruntime is imported; the provider's
``DT_NEEDED`` names then match libraries already in the process. A ``.pth`` file in the GPU
venv calls :func:`install_hook`, which does that on the first ``import onnxruntime`` in any
Python of the venv (ortft, pytest, ``torch_ort.configure``, a user's script) at no start-up
cost to Pythons that never import it; no ``LD_LIBRARY_PATH`` for anyone to remember.

This module imports only the standard library: it runs from the ``.pth`` at interpreter start.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

SUBDIR = "cuda11"  # under sys.prefix: where setup.sh's `pip install --target` puts the wheels
ENV_ROOT = "ORTFT_CUDA11_DIR"  # overrides <sys.prefix>/cuda11 (tests, or a shared copy)
# Load order, each after what it links to (readelf -d: cuBLAS needs cuBLASLt; every cuDNN
# sub-library needs ops_infer; the train ones need their infer one). nvrtc is no DT_NEEDED of
# ORT's: cuDNN 8 dlopens it for its runtime-compiled engines, from a RUNPATH ($ORIGIN/../../nvrtc)
# that does not match the wheel's folder (cuda_nvrtc), so it is loaded here too.
LIBRARIES = [
    "cuda_runtime/lib/libcudart.so.11.0",
    "cublas/lib/libcublasLt.so.11",
    "cublas/lib/libcublas.so.11",
    "curand/lib/libcurand.so.10",
    "cufft/lib/libcufft.so.10",
    "cuda_nvrtc/lib/libnvrtc.so.11.2",
    "cudnn/lib/libcudnn_ops_infer.so.8",
    "cudnn/lib/libcudnn_ops_train.so.8",
    "cudnn/lib/libcudnn_cnn_infer.so.8",
    "cudnn/lib/libcudnn_cnn_train.so.8",
    "cudnn/lib/libcudnn_adv_infer.so.8",
    "cudnn/lib/libcudnn_adv_train.so.8",
    "cudnn/lib/libcudnn.so.8",
]
# The NVIDIA driver's library: installed with the driver, never from PyPI; cudart dlopens it.
DRIVER_LIBRARY = "libcuda.so.1"

_loaded: list[str] = []


class CudaLibsError(Exception):
    """A CUDA 11.8 library of the GPU profile is missing or does not load."""


def root() -> Path:
    """Where the GPU profile's ``nvidia/`` tree is (it may not exist: the CPU profile)."""
    override = os.environ.get(ENV_ROOT)
    return Path(override) if override else Path(sys.prefix) / SUBDIR


def installed() -> bool:
    """Whether this environment has the GPU profile (``make setup GPU=1``)."""
    return (root() / "nvidia").is_dir()


def lib_dirs() -> list[Path]:
    base = root() / "nvidia"
    return sorted({(base / rel).parent for rel in LIBRARIES})


def library_path(rel: str) -> Path:
    """Where to load ``rel`` from. cuRAND is the one soname CUDA 11.8 and 12.4 share
    (``libcurand.so.10``: 10.3.0 and 10.3.5) and a process holds one of them, so it is torch's
    newer copy when torch's wheel is installed: it serves ORT (same soname, so ABI-compatible)
    and also whatever torch needs of 10.3.5, whichever of the two is imported first."""
    if rel.startswith("curand/"):
        torch_copy = Path(sysconfig.get_paths()["purelib"]) / "nvidia" / rel
        if torch_copy.is_file():
            return torch_copy
    return root() / "nvidia" / rel


def loaded() -> list[str]:
    """The libraries :func:`preload` has loaded into this process (full paths)."""
    return list(_loaded)


def preload() -> list[str]:
    """Load the CUDA 11.8 libraries into this process, once. Needs no GPU and no driver."""
    import ctypes

    if _loaded:
        return list(_loaded)
    for rel in LIBRARIES:
        path = library_path(rel)
        if not path.is_file():
            raise CudaLibsError(
                f"{path} is missing from the GPU profile; run `make setup GPU=1` again"
            )
        try:
            ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
        except OSError as err:
            raise CudaLibsError(f"cannot load {path}: {err}") from None
        _loaded.append(str(path))
    return list(_loaded)


class _PreloadOnImport(importlib.abc.MetaPathFinder):
    """Preloads on the first ``import onnxruntime``, then steps aside for the real import."""

    def find_spec(self, name, path=None, target=None):  # noqa: ANN001 (importlib's signature)
        if name == "onnxruntime":
            _remove_hook()
            try:
                preload()
            except CudaLibsError as err:
                # onnxruntime still imports and runs on the CPU; `ortft doctor` reports it too.
                print(f"ortft: ORT's CUDA provider will not load: {err}", file=sys.stderr)
        return None


def _remove_hook() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _PreloadOnImport)]


def install_hook() -> bool:
    """Called from the GPU venv's ``.pth``: preload before onnxruntime's first import."""
    if not installed() or "onnxruntime" in sys.modules:
        return False
    _remove_hook()
    sys.meta_path.insert(0, _PreloadOnImport())
    return True


# --------------------------------------------------------------------------- resolution check


def provider_library(name: str = "cuda") -> Path | None:
    """onnxruntime's ``libonnxruntime_providers_<name>.so``, found without importing it."""
    spec = importlib.util.find_spec("onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "capi"
    path = path / f"libonnxruntime_providers_{name}.so"
    return path if path.is_file() else None


def parse_ldd(text: str) -> list[str]:
    """The library names ``ldd`` printed as ``not found``."""
    return [line.split("=>")[0].strip() for line in text.splitlines() if "=> not found" in line]


def unresolved(library: Path, extra_dirs: list[Path] | None = None) -> list[str]:
    """Libraries ``library`` needs (transitively) that the loader cannot find, the driver's
    ``libcuda.so.1`` excepted. ``extra_dirs`` go first on the search path, as the preload
    puts them first in the process. ``ldd`` runs no code of the library (its static
    initialisers abort without a driver: CUDADriverWrapper wants libcuda.so.1)."""
    env = dict(os.environ)
    dirs = [str(d) for d in (extra_dirs or [])]
    if env.get("LD_LIBRARY_PATH"):
        dirs.append(env["LD_LIBRARY_PATH"])
    if dirs:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(dirs)
    try:
        proc = subprocess.run(
            ["ldd", str(library)], capture_output=True, text=True, env=env, timeout=60
        )
    except FileNotFoundError:
        raise CudaLibsError("ldd not found (Debian/Ubuntu: apt-get install libc-bin)") from None
    if proc.returncode != 0:
        raise CudaLibsError(f"ldd {library} failed: {proc.stderr.strip() or proc.returncode}")
    return [name for name in parse_ldd(proc.stdout) if name != DRIVER_LIBRARY]


def main(argv: list[str] | None = None) -> int:
    """What setup.sh runs after installing the GPU profile (``python -c 'import sys,
    ortft.env.cudalibs as c; sys.exit(c.main([]))'``): names the unresolved libraries of ORT's CUDA
    provider, exit 1; none, exit 0."""
    provider = provider_library()
    if provider is None:
        print("error: onnxruntime has no CUDA provider library here", file=sys.stderr)
        return 1
    try:
        missing = unresolved(provider, lib_dirs() if installed() else [])
    except CudaLibsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    if missing:
        print(f"error: {provider.name} still needs {', '.join(missing)}", file=sys.stderr)
        return 1
    where = root() if installed() else "the system's library path"
    print(f"{provider.name}: every library resolves (CUDA 11.8 from {where})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
