"""The GPU profile without a GPU: ORT's CUDA provider libraries (ortft.env.cudalibs), doctor's GPU
lines in both profiles (a visible GPU simulated), and `make gpu-check`'s plan and refusal.

The CUDA provider probed here is onnxruntime-training's (linked against CUDA 11.8): its tests
are marked ``ort``; the current profile's onnxruntime has no CUDA provider to probe."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ortft.env import cudalibs
from ortft.tools import bench, doctor

ROOT = Path(__file__).resolve().parent.parent
# What `ldd libonnxruntime_providers_cuda.so` reports missing with torch's CUDA 12.4 wheels only.
CUDA11_SONAMES = {
    "libcublasLt.so.11",
    "libcublas.so.11",
    "libcudnn.so.8",
    "libcurand.so.10",
    "libcufft.so.10",
    "libcudart.so.11.0",
}

LDD_OUTPUT = """\
\tlinux-vdso.so.1 (0x00007ffd)
\tlibcublasLt.so.11 => not found
\tlibcuda.so.1 => not found
\tlibdl.so.2 => /lib/x86_64-linux-gnu/libdl.so.2 (0x00007f12)
"""


def test_parse_ldd_names_the_missing_libraries():
    assert cudalibs.parse_ldd(LDD_OUTPUT) == ["libcublasLt.so.11", "libcuda.so.1"]


@pytest.mark.ort
def test_the_cpu_profile_misses_exactly_the_cuda_11_libraries(monkeypatch):
    monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)
    provider = cudalibs.provider_library()
    assert provider is not None and provider.name == "libonnxruntime_providers_cuda.so"
    assert set(cudalibs.unresolved(provider)) == CUDA11_SONAMES


def test_every_needed_soname_is_in_the_preload_list():
    names = {Path(rel).name for rel in cudalibs.LIBRARIES}
    assert names >= CUDA11_SONAMES
    # cuBLAS links cuBLASLt, cudnn's train libraries their infer ones: dependencies first
    order = [Path(rel).name for rel in cudalibs.LIBRARIES]
    assert order.index("libcublasLt.so.11") < order.index("libcublas.so.11")
    assert order.index("libcudnn_ops_infer.so.8") < order.index("libcudnn_cnn_infer.so.8")


def test_the_lock_pins_one_version_of_each_wheel():
    lines = (ROOT / "requirements" / "gpu-cu11.txt").read_text().splitlines()
    pins = [line for line in lines if line and not line.startswith("#")]
    assert all("==" in pin and pin.startswith("nvidia-") for pin in pins), pins
    wheels = {pin.split("==")[0] for pin in pins}
    folders = {rel.split("/")[0].replace("_", "-") for rel in cudalibs.LIBRARIES}
    assert wheels == {f"nvidia-{folder}-cu11" for folder in folders}


def test_the_hook_preloads_on_import_and_says_what_is_missing(tmp_path):
    """A GPU profile whose libraries are gone: `import onnxruntime` still works (CPU), and the
    hook says on stderr which file is missing, once."""
    (tmp_path / "nvidia").mkdir()
    code = (
        "import ortft.env.cudalibs as c\n"
        "assert c.install_hook()\n"
        "import onnxruntime\n"
        "import sys; assert not any(isinstance(f, c._PreloadOnImport) for f in sys.meta_path)\n"
        "print(onnxruntime.get_available_providers())\n"
    )
    env = {**os.environ, cudalibs.ENV_ROOT: str(tmp_path), "PYTHONPATH": str(ROOT)}
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert "CPUExecutionProvider" in res.stdout
    lines = [line for line in res.stderr.splitlines() if line.startswith("ortft:")]
    assert len(lines) == 1 and "libcudart.so.11.0 is missing" in lines[0], res.stderr


def test_no_hook_without_the_gpu_profile(tmp_path, monkeypatch):
    monkeypatch.setenv(cudalibs.ENV_ROOT, str(tmp_path / "absent"))
    assert not cudalibs.installed()
    assert not cudalibs.install_hook()


# --------------------------------------------------------------------------- doctor


@pytest.mark.parametrize(
    ("gpu", "profile", "verdict"),
    [(True, True, doctor.FAIL), (True, False, doctor.FAIL), (False, True, doctor.WARN),
     (False, False, doctor.INFO)],
)  # fmt: skip
def test_a_missing_gpu_piece_matters_as_much_as_the_machine_says(gpu, profile, verdict):
    check = doctor.provider_check("CUDA provider", "lib.so", ["libcudnn.so.8"], gpu, profile)
    assert check.verdict == verdict
    assert "libcudnn.so.8 not found" in check.value and "GPU=1" in (check.fix or "")
    assert doctor.gpu_allocator_check(None, gpu, profile).verdict == verdict
    assert doctor.gpu_allocator_check(["libcudart.so.13"], gpu, profile).verdict == verdict
    assert doctor.provider_check("CUDA provider", "lib.so", [], gpu, profile).verdict == doctor.OK
    assert doctor.gpu_allocator_check(["libcudart.so.12"], gpu, profile).verdict == doctor.OK
    # fused_ops serves only adamw_ort_fused: context wherever it is missing, GPU or not
    assert doctor.fused_ops_check(False).verdict == doctor.INFO
    assert doctor.fused_ops_check(True).verdict == doctor.OK


def test_a_cpu_provider_that_cannot_load_always_fails():
    check = doctor.provider_check("CPU provider", "x.so", ["libgomp.so.1"], False, False)
    assert check.verdict == doctor.FAIL


def profile(monkeypatch, tmp_path, *, installed: bool, gpu: bool, missing: list[str]) -> None:
    """Simulate a profile and a machine: where the CUDA 11.8 libraries are, what resolves."""
    if installed:
        (tmp_path / "nvidia").mkdir(exist_ok=True)
    monkeypatch.setenv(cudalibs.ENV_ROOT, str(tmp_path if installed else tmp_path / "absent"))
    monkeypatch.setattr(doctor, "_gpu_visible", lambda: gpu)
    monkeypatch.setattr(cudalibs, "unresolved", lambda lib, dirs=None: list(missing))


@pytest.mark.ort
def test_doctor_gpu_profile_without_a_gpu_warns(monkeypatch, tmp_path):
    profile(monkeypatch, tmp_path, installed=True, gpu=False, missing=["libcudnn.so.8"])
    check = doctor._probe_provider("CUDAExecutionProvider", gpu_visible=False)
    assert (check.name, check.verdict) == ("CUDA provider", doctor.WARN)
    allocator, fused = doctor._probe_cuda_extensions()  # set-up built the allocator here
    assert allocator.verdict == doctor.OK and "libcudart.so.12" in allocator.value
    assert fused.verdict == doctor.INFO and "--fused-ops" in (fused.fix or "")


@pytest.mark.ort
def test_doctor_gpu_profile_that_resolves_but_was_not_preloaded(monkeypatch, tmp_path):
    profile(monkeypatch, tmp_path, installed=True, gpu=False, missing=[])
    monkeypatch.setattr(cudalibs, "_loaded", [])
    check = doctor._probe_provider("CUDAExecutionProvider", gpu_visible=False)
    assert check.verdict == doctor.WARN and "nothing preloaded" in check.value
    monkeypatch.setattr(cudalibs, "_loaded", ["libcudart.so.11.0"])
    check = doctor._probe_provider("CUDAExecutionProvider", gpu_visible=False)
    assert check.verdict == doctor.OK and str(tmp_path) in check.value


@pytest.mark.ort
def test_doctor_fails_with_a_visible_gpu_and_the_cpu_profile(monkeypatch, tmp_path):
    """The issue's case: a GPU machine, torch's CUDA 12.4 libraries only. Doctor used to say
    `ok execution providers CUDAExecutionProvider`; now the CUDA lines fail and so does doctor."""
    monkeypatch.setenv(cudalibs.ENV_ROOT, str(tmp_path / "absent"))
    monkeypatch.setattr(doctor, "_gpu_visible", lambda: True)
    checks = {c.name: c for c in doctor._probe_ort() + doctor._probe_cuda_extensions()}
    assert checks["CUDA provider"].verdict == doctor.FAIL
    assert "libcudart.so.11.0" in checks["CUDA provider"].value
    assert checks["CPU provider"].verdict == doctor.OK
    assert checks["GPU allocator extension"].verdict == doctor.OK  # built on every machine
    assert doctor.exit_code(list(checks.values())) == 1


@pytest.mark.ort
def test_doctor_cpu_profile_without_a_gpu_is_information(monkeypatch, tmp_path):
    monkeypatch.setenv(cudalibs.ENV_ROOT, str(tmp_path / "absent"))
    monkeypatch.setattr(doctor, "_gpu_visible", lambda: False)
    checks = {c.name: c for c in doctor._probe_ort() + doctor._probe_cuda_extensions()}
    assert checks["CUDA provider"].verdict == doctor.INFO
    assert checks["GPU allocator extension"].verdict == doctor.OK
    assert checks["fused_ops extension"].verdict == doctor.INFO


# --------------------------------------------------------------------------- make gpu-check


def _gpu_check_module():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks/gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _no_gpu_path(tmp_path: Path, smi: str | None) -> str:
    """A PATH with bash and coreutils, plus a fake nvidia-smi when ``smi`` is given."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if smi is not None:
        fake = bin_dir / "nvidia-smi"
        fake.write_text(f"#!/bin/sh\n{smi}\n")
        fake.chmod(0o755)
    return f"{bin_dir}:/usr/bin:/bin"


@pytest.mark.parametrize(
    "smi", [None, "echo 'No devices were found'; exit 6", "echo 'NVIDIA-SMI has failed'; exit 9"]
)
def test_gpu_check_refuses_without_a_gpu(tmp_path, smi):
    res = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu-check.sh")],
        capture_output=True,
        text=True,
        env={"PATH": _no_gpu_path(tmp_path, smi), "HOME": str(tmp_path)},
        timeout=60,
    )
    assert res.returncode == 2
    assert res.stdout == ""
    assert res.stderr.splitlines() == [
        "gpu-check: no NVIDIA GPU visible (nvidia-smi -L lists none); run it on a machine with one"
    ]


@pytest.mark.parametrize("gpus", [1, 2])
def test_gpu_check_plan_is_valid_without_a_gpu(tmp_path, gpus):
    """Every bench step's --backends parses and every recipe it writes validates, so the first
    run on a GPU machine does not die on a typo; DDP only with two GPUs."""
    from ortft.recipe import io as recipe_io

    gc = _gpu_check_module()
    gc.write_precision_recipes(tmp_path)
    steps = gc.plan(gpus, steps=20, repeats=2, recipe_dir=tmp_path)
    names = [s["name"] for s in steps]
    fused = {s["name"]: " ".join(s["cmd"]) for s in steps}["fused adam"]
    assert "adamw_ort_fused" not in fused  # set-up builds no fused_ops: only where it exists
    with_fused = gc.plan(gpus, steps=20, repeats=2, recipe_dir=tmp_path, fused_ops=True)
    assert "adamw_ort_fused" in " ".join(with_fused[names.index("fused adam")]["cmd"])
    assert names[:3] == ["doctor", "allocator", "interop"]
    for step in steps[1:3]:  # the python -c probes at least compile here
        compile(step["cmd"][-1], step["name"], "exec")
    assert {"fused adam", "padding elimination"} <= set(names)
    assert ("ddp2 ort" in names) == (gpus >= 2)
    for name in ("compiled bf16", "auto routes"):  # training runs: their overrides validate
        cmd = steps[names.index(name)]["cmd"]
        assert steps[names.index(name)]["run_dir"]
        at = cmd.index("train") + 1
        overrides = [a for a in cmd[at + 1 :] if "=" in a]
        r = recipe_io.load(cmd[at], overrides, check_files=False).recipe
        assert r.backend.compile in (True, "auto") and r.hardware.device == "cuda"
    for step in steps:
        cmd = step["cmd"]
        if "bench" in cmd:
            labels = [v.label for v in bench.parse_variants(cmd[cmd.index("--backends") + 1])]
            assert "torch" in labels  # the bench's baseline
            recipe = recipe_io.load(cmd[cmd.index("bench") + 1], check_files=False).recipe
            assert recipe.hardware.device == "cuda"
    dtypes = {recipe_io.load(p, check_files=False).recipe.precision.dtype
              for p in tmp_path.glob("bert-cls-gpu-*.yaml")}  # fmt: skip
    assert dtypes == {"fp32", "bf16", "fp16"}


# --------------------------------------------------------------------------- the real libraries


@pytest.mark.slow
@pytest.mark.ort
def test_the_gpu_lock_resolves_every_library_of_the_cuda_provider(tmp_path):
    """requirements/gpu-cu11.txt installed as setup.sh does (pip --target): ldd of ORT's CUDA
    provider finds everything but the driver, and `import onnxruntime` with the hook preloads
    all of it into the process (no GPU needed to load them). ~1.4 GB wheels, ~2.2 GB on disk."""
    wheels = Path(os.environ.get("ORTFT_CACHE") or Path.home() / ".cache" / "ortft") / "wheels"
    target = tmp_path / "cuda11"
    install = [sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(target),
               "--find-links", str(wheels), "-r", str(ROOT / "requirements" / "gpu-cu11.txt")]  # fmt: skip
    res = subprocess.run(install, capture_output=True, text=True, timeout=1800)
    assert res.returncode == 0, res.stderr[-2000:]
    env = {**os.environ, cudalibs.ENV_ROOT: str(target), "PYTHONPATH": str(ROOT)}
    env.pop("LD_LIBRARY_PATH", None)
    code = (
        "import ortft.env.cudalibs as c, json\n"
        "provider = c.provider_library()\n"
        "missing = c.unresolved(provider, c.lib_dirs())\n"
        "c.install_hook()\n"
        "import onnxruntime\n"
        "maps = open('/proc/self/maps').read()\n"
        "print(json.dumps({'missing': missing, 'loaded': c.loaded(),\n"
        "                  'mapped': [p for p in c.loaded() if p in maps]}))\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert res.returncode == 0, res.stderr[-2000:]
    import json

    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["missing"] == []
    assert len(out["loaded"]) == len(cudalibs.LIBRARIES)
    assert out["mapped"] == out["loaded"]


def test_curand_comes_from_torch_when_torch_has_it(tmp_path, monkeypatch):
    """libcurand.so.10 is CUDA 11.8's and 12.4's soname alike; the process gets torch's newer
    copy, which both can use, instead of whichever import came first. The site folder is made
    here: torch's nvidia-curand-cu12 wheel is the ort profile's (a CPU torch has none)."""
    profile_root, site = tmp_path / "cuda11", tmp_path / "site"
    monkeypatch.setenv(cudalibs.ENV_ROOT, str(profile_root))
    monkeypatch.setattr(cudalibs.sysconfig, "get_paths", lambda: {"purelib": str(site)})
    curand = "curand/lib/libcurand.so.10"
    assert cudalibs.library_path(curand) == profile_root / "nvidia" / curand  # torch has none
    (site / "nvidia" / curand).parent.mkdir(parents=True)
    (site / "nvidia" / curand).write_bytes(b"\0")
    assert cudalibs.library_path(curand) == site / "nvidia" / curand
    assert cudalibs.library_path("cublas/lib/libcublas.so.11") == (
        profile_root / "nvidia/cublas/lib/libcublas.so.11"
    )


def test_gpu_check_records_a_step_whatever_its_outcome(tmp_path):
    gc = _gpu_check_module()
    ok = gc.run_step(
        {"name": "a", "cmd": [sys.executable, "-c", "print('{\"x\": 1}')"]}, tmp_path, 60
    )
    assert (ok["exit_code"], ok["result"]) == (0, {"x": 1})
    code = "import sys; print('noise'); print('{\"y\": 2}'); sys.exit(3)"
    bad = gc.run_step({"name": "b", "cmd": [sys.executable, "-c", code]}, tmp_path, 60)
    assert (bad["exit_code"], bad["result"]) == (3, {"y": 2})
    slow = gc.run_step({"name": "c", "cmd": [sys.executable, "-c", "import time; time.sleep(5)"]},
                       tmp_path, 0.5)  # fmt: skip
    assert slow["timed_out"] and slow["exit_code"] is None
