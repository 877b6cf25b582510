"""Build ORTModule's torch C++ extensions, and cache them outside the virtual environment.

ORTModule needs a few small C++ extensions compiled against the installed torch. They live as
``*.so`` files in onnxruntime's ``training/ortmodule/torch_cpp_extensions/`` folder, where
ORTModule imports them from:

* ``aten_op_executor`` and ``torch_interop_utils`` (``cpu/``): every run.
* ``torch_cuda_extensions`` (``cuda/``, one ``.cc``, no device code): every ORTModule on a GPU.
  Built on every machine, GPU or not, with the host compiler and a ``CUDA_HOME`` made of PyPI's
  CUDA 12.4 wheels (``cuda_extensions.py`` says how), so its tests run everywhere.
* ``fused_ops`` (``cuda/``, ``.cu`` kernels): only ``optimizer.name: adamw_ort_fused``. It needs a
  CUDA 12 nvcc, which PyPI does not have: built on request by ``python -m ortft.env.extensions
  --fused-ops`` where a CUDA 12.x toolkit is installed (docs/gpu.md).

Compiling takes minutes on 2 cores, so the built files are saved under
``${ORTFT_CACHE:-~/.cache/ortft}/extensions/<key>/`` (the key hashes the torch and
onnxruntime-training versions (and its distribution when it is the -cpu one), the Python
version and the CUDA runtime wheels the allocator is built against) and copied back on the
next set-up. ``python -m ortft.env.extensions`` is what ``make setup`` runs; ``ortft doctor
--fix`` calls :func:`ensure_built`.

Over 450 lines: one lifecycle of the extensions (status, build side by side, cache, restore,
load check) that ``make setup`` and ``ortft doctor`` share; the GPU allocator's own build is
``cuda_extensions.py``.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ortft.core import fsutil
from ortft.core.errors import OrtftError
from ortft.env import cuda_extensions, ort_training

MARKER = "ortft-extensions.json"  # written next to the .so files: which key they were built for
FIX_COMMAND = "ortft doctor --fix"  # or `make setup` in a clone


class ExtensionError(OrtftError):
    """Building or restoring the extensions failed; the message says what to do."""


@dataclass
class Status:
    """What is installed now. ``built`` means every expected extension is present and matches."""

    directory: str | None
    built: bool
    key: str | None
    expected: list[str] = field(default_factory=list)
    present: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    stale: bool = False  # the files were built for another torch / onnxruntime / python
    problem: str | None = None  # why the status could not be worked out

    def as_dict(self) -> dict:
        return asdict(self)


# --------------------------------------------------------------------------- where things are


def extensions_dir() -> Path | None:
    """onnxruntime's ORTMODULE_TORCH_CPP_DIR, found without importing onnxruntime or torch."""
    spec = importlib.util.find_spec("onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(list(spec.submodule_search_locations)[0])
    path = root / "training" / "ortmodule" / "torch_cpp_extensions"
    return path if path.is_dir() else None


def cache_root() -> Path:
    base = os.environ.get("ORTFT_CACHE") or Path.home() / ".cache" / "ortft"
    return Path(base).expanduser() / "extensions"


def _setup_scripts(ext_dir: Path, kind: str) -> list[Path]:
    """The extensions' setup.py files of one kind ('cpu' or 'cuda'), in build order."""
    return sorted((ext_dir / kind).glob("*/setup.py"))


def expected_names(ext_dir: Path) -> list[str]:
    """What set-up builds: the CPU extensions, and the GPU allocator where its source is (both
    ORT builds, CUDA and -cpu, ship it). fused_ops is built only on request (module docstring)."""
    names = [p.parent.name for p in _setup_scripts(ext_dir, "cpu")]
    if cuda_extensions.source_dir(ext_dir) is not None:
        names.append(cuda_extensions.NAME)
    return names


def built_names(ext_dir: Path) -> list[str]:
    return sorted({_module_name(p) for p in _built_files(ext_dir)})


def built_file(name: str) -> Path | None:
    """The built ``.so`` of extension ``name`` (``fused_ops``, ``torch_gpu_allocator``...) in
    onnxruntime's extensions folder, or None."""
    ext_dir = extensions_dir()
    found = [so for so in _built_files(ext_dir) if _module_name(so) == name] if ext_dir else []
    return found[0] if found else None


def _built_files(ext_dir: Path) -> list[Path]:
    return sorted(ext_dir.glob("*.so"))


def _module_name(so: Path) -> str:
    return so.name.split(".", 1)[0]  # aten_op_executor.cpython-311-x86_64-linux-gnu.so


# --------------------------------------------------------------------------- the cache key


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def key_inputs() -> dict:
    ort = ort_training.installed()
    inputs = {
        "torch": _dist_version("torch"),
        "onnxruntime-training": ort[1] if ort else None,
        "python": f"{sys.implementation.name}-{sys.version_info.major}.{sys.version_info.minor}",
        "platform": f"{sys.platform}-{platform.machine()}",
        # what the allocator is built against; whether a GPU is visible changes nothing built
        "gpu-allocator": cuda_extensions.wheel_versions(),
    }
    # Only when it is not the default distribution, so the keys of existing caches still hold.
    if ort and ort[0] != "onnxruntime-training":
        inputs["ort-distribution"] = ort[0]
    return inputs


def cache_key(inputs: dict) -> str:
    text = json.dumps(inputs, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# --------------------------------------------------------------------------- status


def status() -> Status:
    """What is built, without building anything (nor importing torch)."""
    ext_dir = extensions_dir()
    if ext_dir is None:
        return Status(None, False, None, problem="onnxruntime-training is not installed")
    key = cache_key(key_inputs())
    expected = expected_names(ext_dir)
    present = built_names(ext_dir)
    missing = [name for name in expected if name not in present]
    stale = False
    marker = ext_dir / MARKER
    if present and marker.is_file():
        try:
            stale = json.loads(marker.read_text()).get("key") != key
        except (OSError, ValueError):
            stale = True
    built = bool(expected) and not missing and not stale
    return Status(str(ext_dir), built, key, expected, present, missing, stale)


def is_built() -> bool:
    return status().built


def check_loads(timeout: float = 300) -> str | None:
    """Import every built extension in a fresh Python; None when all load, else the error.

    This is what catches an ABI mismatch (e.g. torch >= 2.7: undefined symbol PyNode).
    """
    ext_dir = extensions_dir()
    names = built_names(ext_dir) if ext_dir else []
    pkg = "onnxruntime.training.ortmodule.torch_cpp_extensions"
    code = "import importlib, torch\n" + "".join(
        f"importlib.import_module({pkg + '.' + name!r})\n" for name in names
    )
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return f"importing the extensions took more than {timeout:.0f} s"
    if proc.returncode == 0:
        return None
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    return lines[-1] if lines else f"exit code {proc.returncode}"


# --------------------------------------------------------------------------- build / restore


def _say(message: str) -> None:
    print(f"[ortft.env.extensions] {message}", file=sys.stderr, flush=True)


def _write_marker(ext_dir: Path, key: str, inputs: dict, source: str) -> None:
    info = {
        "key": key,
        "inputs": inputs,
        "source": source,
        "at": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    (ext_dir / MARKER).write_text(json.dumps(info, indent=2) + "\n")


def _restore(ext_dir: Path, cached: Path) -> list[Path]:
    copied = []
    for so in sorted(cached.glob("*.so")):
        dest = ext_dir / so.name
        shutil.copyfile(so, dest)
        copied.append(dest)
    return copied


def _save(ext_dir: Path, key: str, inputs: dict) -> Path | None:
    """Copy the built .so files into the cache (atomically: temp dir, then swapped in)."""
    dest = cache_root() / key
    try:
        with fsutil.atomic_dir(dest) as tmp:
            for so in _built_files(ext_dir):
                shutil.copyfile(so, tmp / so.name)
            (tmp / "inputs.json").write_text(json.dumps(inputs, indent=2) + "\n")
        return dest
    except OSError as err:  # a read-only home is no reason to fail the set-up
        _say(f"warning: could not cache the built extensions in {dest} ({err})")
        return None


def _preflight() -> None:
    """Fail early, with the fix, when the build cannot work on this machine."""
    if shutil.which(os.environ.get("CXX", "c++")) is None and shutil.which("g++") is None:
        raise ExtensionError(
            "no C++ compiler found (c++ / g++), which ORTModule's extensions need; install one "
            "(Debian/Ubuntu: apt-get install g++) and run `make setup` (or `ortft doctor --fix`) "
            "again"
        )
    include = sysconfig.get_paths().get("include", "")
    if not (Path(include) / "Python.h").is_file():
        raise ExtensionError(
            f"Python headers not found ({include}/Python.h); install them (Debian/Ubuntu: "
            f"apt-get install python{sys.version_info.major}.{sys.version_info.minor}-dev) "
            "and run `make setup` (or `ortft doctor --fix`) again"
        )


def _run_logged(cmd: list[str], cwd: Path, env: dict, log: Path, what: str) -> None:
    with log.open("a") as out:
        out.write(f"\n$ {' '.join(cmd)}  (cwd {cwd})\n")
        out.flush()
        code = subprocess.call(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    if code != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-15:]
        sys.stderr.write("\n".join(f"    {line}" for line in tail) + "\n")
        hint = "a C++ compiler (g++) and the Python headers (python3.11-dev) are needed"
        if any("Python.h" in line for line in tail):
            hint = "install the Python headers (Debian/Ubuntu: apt-get install python3.11-dev)"
        raise ExtensionError(
            f"building {what} failed (exit {code}); full log: {log}. Fix: {hint}, then run "
            "`make setup` (or `ortft doctor --fix`) again"
        )


def _build(ext_dir: Path, log: Path) -> None:
    """The CPU extensions as onnxruntime's install.build_torch_cpp_extensions builds them, and
    the GPU allocator (cuda_extensions.py), side by side: two of the three are one source file
    each, which one compiler process builds on one core. Each gets its own build tree in a temp
    dir (no stale objects from another torch) and its own log next to ``log``."""
    env = dict(os.environ, ONNXRUNTIME_CUDA_VERSION="", ONNXRUNTIME_ROCM_VERSION="")
    scripts = _setup_scripts(ext_dir, "cpu")
    allocator = cuda_extensions.source_dir(ext_dir) is not None
    names = [p.parent.name for p in scripts] + [cuda_extensions.NAME] * allocator
    _say(f"compiling {', '.join(names)} side by side (a few minutes on 2 cores)")
    with tempfile.TemporaryDirectory(prefix="ortft-ext-build-") as build_base:
        base = Path(build_base)

        def cpu(setup_py: Path) -> None:
            name = setup_py.parent.name
            cmd = [sys.executable, str(setup_py), "build", "--build-base", str(base / name)]
            _run_logged(
                cmd, ext_dir, env, _job_log(log, name), f"ORTModule's C++ extension '{name}'"
            )

        def gpu_allocator() -> None:
            job_log = _job_log(log, cuda_extensions.NAME)
            try:
                cuda_extensions.build(
                    ext_dir,
                    base,
                    lambda cmd, cwd, env, what: _run_logged(cmd, cwd, env, job_log, what),
                )
            except cuda_extensions.CudaBuildError as err:
                raise ExtensionError(str(err)) from None

        with concurrent.futures.ThreadPoolExecutor(len(names)) as pool:
            builds = [pool.submit(cpu, setup_py) for setup_py in scripts]
            builds += [pool.submit(gpu_allocator)] * allocator
        for build in builds:
            build.result()  # the first failure, once every build has ended
        for so in base.glob("*/lib.*/*.so"):
            shutil.copyfile(so, ext_dir / so.name)


def _job_log(log: Path, name: str) -> Path:
    """One build's log, emptied (side by side, each build keeps its own file)."""
    job_log = log.with_name(f"{log.stem}-{name}.log")
    job_log.write_text(f"ortft: building {name}\n")
    return job_log


def build_fused_ops() -> Path:
    """fused_ops (``optimizer.name: adamw_ort_fused``) with the CUDA 12.x toolkit named by
    ``CUDA_HOME``, into the extensions folder and the cache of the current key (so a restore
    brings it back with the others)."""
    ext_dir = extensions_dir()
    if ext_dir is None:
        raise ExtensionError("onnxruntime-training is not installed; run `make setup` first")
    log = cache_root() / "build-fused_ops.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(f"ortft: building fused_ops with CUDA_HOME={os.environ.get('CUDA_HOME')}\n")
    with tempfile.TemporaryDirectory(prefix="ortft-fused-ops-") as build_base:
        try:
            dest = cuda_extensions.build_fused_ops(
                ext_dir,
                Path(build_base),
                lambda cmd, cwd, env, what: _run_logged(cmd, cwd, env, log, what),
            )
        except cuda_extensions.CudaBuildError as err:
            raise ExtensionError(str(err)) from None
    inputs = key_inputs()
    _save(ext_dir, cache_key(inputs), inputs)
    return dest


def ensure_built(force: bool = False, use_cache: bool = True) -> Status:
    """Make ORTModule's extensions present and loadable: keep, restore from cache, or build."""
    ext_dir = extensions_dir()
    if ext_dir is None:
        raise ExtensionError(
            "onnxruntime-training is not installed; run `pip install -r requirements/lock.txt` "
            "(or `make setup`) first"
        )
    inputs = key_inputs()
    key = cache_key(inputs)
    current = status()
    cached = cache_root() / key
    if current.built and not force:
        adopted = not (ext_dir / MARKER).is_file()  # e.g. built by torch_ort.configure
        problem = check_loads() if adopted else None
        if problem is None:
            if adopted:
                _write_marker(ext_dir, key, inputs, "found built")
            if use_cache and not cached.is_dir():
                _save(ext_dir, key, inputs)
            _say(f"already built in {ext_dir} ({', '.join(current.present)})")
            return current
        _say(f"the extensions in {ext_dir} do not load ({problem}); rebuilding")

    if not os.access(ext_dir, os.W_OK):
        raise ExtensionError(
            f"{ext_dir} is not writable; run this with the Python environment's owner"
        )
    from_cache = use_cache and not force and cached.is_dir() and any(cached.glob("*.so"))
    if not from_cache:
        _preflight()  # before deleting anything: no compiler must not cost the old files
    for so in _built_files(ext_dir):  # never mix files from two builds
        so.unlink()
    (ext_dir / MARKER).unlink(missing_ok=True)

    if from_cache:
        _restore(ext_dir, cached)
        problem = check_loads()
        if problem is None:
            _write_marker(ext_dir, key, inputs, f"cache {cached}")
            _say(f"restored from cache {cached}")
            return status()
        _say(f"cached build in {cached} does not load ({problem}); rebuilding")
        for so in _built_files(ext_dir):
            so.unlink()
        _preflight()

    log_dir = cache_root()
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"build-{key}.log"
    log.write_text(f"ortft: building ORTModule's extensions for {json.dumps(inputs)}\n")
    start = time.monotonic()
    _build(ext_dir, log)
    result = status()
    if result.missing:
        raise ExtensionError(
            f"the build finished but {', '.join(result.missing)} is missing from {ext_dir}; "
            f"see {log.with_name(log.stem + '-*.log')}"
        )
    problem = check_loads()
    if problem is not None:
        raise ExtensionError(
            f"the extensions built but do not load: {problem}. This usually means a torch "
            "outside the supported stack; run `pip install -r requirements/lock.txt`, then "
            f"`{FIX_COMMAND}`"
        )
    _write_marker(ext_dir, key, inputs, "build")
    saved = _save(ext_dir, key, inputs)
    where = f"; cached in {saved}" if saved else ""
    _say(f"built {', '.join(result.present)} in {time.monotonic() - start:.0f} s{where}")
    return status()


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m ortft.env.extensions",
        description="Build (or restore from cache) ORTModule's torch C++ extensions.",
    )
    parser.add_argument("--force", action="store_true", help="rebuild even if already built")
    parser.add_argument("--no-cache", action="store_true", help="do not restore from the cache")
    parser.add_argument(
        "--status", action="store_true", help="print the status as JSON; build nothing"
    )
    parser.add_argument(
        "--fused-ops",
        action="store_true",
        help="also build fused_ops (adamw_ort_fused) with the CUDA 12.x nvcc in $CUDA_HOME",
    )
    args = parser.parse_args(argv)
    if args.status:
        print(json.dumps(status().as_dict(), indent=2))
        return 0
    try:
        result = ensure_built(force=args.force, use_cache=not args.no_cache)
        if args.fused_ops:
            _say(f"built {build_fused_ops()}")
            result = status()
    except ExtensionError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(result.directory)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
