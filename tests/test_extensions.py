"""ortft.env.extensions: what counts as built, and the cache outside the venv (no compiler needed)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from ortft.env import extensions, profiles

SO = ".cpython-311-x86_64-linux-gnu.so"


@pytest.fixture()
def fake_dir(tmp_path, monkeypatch):
    """A stand-in for onnxruntime's torch_cpp_extensions folder."""
    ext = tmp_path / "torch_cpp_extensions"
    for kind, name in [
        ("cpu", "aten_op_executor"),
        ("cpu", "torch_interop_utils"),
        ("cuda", "fused_ops"),
        ("cuda", "torch_gpu_allocator"),
    ]:
        (ext / kind / name).mkdir(parents=True)
        (ext / kind / name / "setup.py").write_text("")
    monkeypatch.setattr(extensions, "extensions_dir", lambda: ext)
    monkeypatch.setenv("ORTFT_CACHE", str(tmp_path / "cache"))
    return ext


BUILT = ("aten_op_executor", "torch_interop_utils", "torch_gpu_allocator")


def test_nothing_built(fake_dir):
    state = extensions.status()
    assert not state.built
    # the GPU allocator on every machine (no nvcc needed); fused_ops only on request
    assert state.expected == list(BUILT)
    assert state.missing == state.expected


def test_set_up_builds_need_no_fused_ops(fake_dir):
    for name in BUILT[:2]:
        (fake_dir / f"{name}{SO}").write_bytes(b"\0")
    assert extensions.status().missing == ["torch_gpu_allocator"]
    (fake_dir / f"torch_gpu_allocator{SO}").write_bytes(b"\0")
    assert extensions.status().built


def test_files_built_for_another_stack_are_stale(fake_dir):
    for name in BUILT:
        (fake_dir / f"{name}{SO}").write_bytes(b"\0")
    (fake_dir / extensions.MARKER).write_text(json.dumps({"key": "another"}))
    state = extensions.status()
    assert state.stale and not state.built


def test_cache_key_changes_with_the_stack():
    inputs = extensions.key_inputs()
    key = extensions.cache_key(inputs)
    assert key == extensions.cache_key(dict(inputs))
    assert key != extensions.cache_key({**inputs, "torch": "2.7.0"})
    # the allocator's own input: the CUDA runtime wheels it is built against, as the profile's
    # lock installs them (12.4.127 beside the ort profile's torch 2.6; none beside a CPU torch)
    lock = profiles.pins(profiles.active(), (sys.version_info.major, sys.version_info.minor))
    runtime = inputs["gpu-allocator"]["nvidia-cuda-runtime-cu12"]
    assert runtime == lock.get("nvidia-cuda-runtime-cu12")
    other = {"nvidia-cuda-runtime-cu12": "12.6.77", "nvidia-cuda-nvcc-cu12": "12.6.85"}
    assert key != extensions.cache_key({**inputs, "gpu-allocator": other})
    assert "cuda" not in inputs  # a visible GPU changes nothing that set-up builds


def test_cache_key_names_the_python_and_the_ort_build(monkeypatch):
    """A 3.11 and a 3.12 venv (CUDA and -cpu ORT builds) never share cached extensions."""
    here = f"cpython-{sys.version_info.major}.{sys.version_info.minor}"
    monkeypatch.setattr(
        extensions.ort_training, "installed", lambda: ("onnxruntime-training", "1.19.2")
    )
    cuda_build = extensions.key_inputs()
    assert cuda_build["python"] == here and "ort-distribution" not in cuda_build
    cpu = ("onnxruntime-training-cpu", "1.19.2")
    monkeypatch.setattr(extensions.ort_training, "installed", lambda: cpu)
    cpu_build = extensions.key_inputs()
    assert cpu_build["onnxruntime-training"] == "1.19.2"
    assert extensions.cache_key(cpu_build) != extensions.cache_key(cuda_build)


def test_save_and_restore_round_trip(fake_dir, tmp_path):
    (fake_dir / f"aten_op_executor{SO}").write_bytes(b"built")
    inputs = extensions.key_inputs()
    saved = extensions._save(fake_dir, "k1", inputs)
    assert saved == tmp_path / "cache" / "extensions" / "k1"
    assert json.loads((saved / "inputs.json").read_text()) == inputs
    (fake_dir / f"aten_op_executor{SO}").unlink()
    restored = extensions._restore(fake_dir, saved)
    assert [p.name for p in restored] == [f"aten_op_executor{SO}"]
    assert (fake_dir / f"aten_op_executor{SO}").read_bytes() == b"built"


def test_no_onnxruntime_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(extensions, "extensions_dir", lambda: None)
    assert extensions.status().problem == "onnxruntime-training is not installed"
    with pytest.raises(extensions.ExtensionError, match="onnxruntime-training is not installed"):
        extensions.ensure_built()


def _fake_nvcc(tmp_path, release: str) -> Path:
    home = tmp_path / f"cuda-{release}"
    (home / "bin").mkdir(parents=True)
    nvcc = home / "bin" / "nvcc"
    nvcc.write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release {release}, V{release}.0'\n")
    nvcc.chmod(0o755)
    return home


def test_fused_ops_covers_v100_to_h100_with_a_cuda_12_nvcc(monkeypatch, tmp_path, fake_dir):
    """The cached CUDA build must serve every GPU sharing the cache, not just the one it was
    built on; a TORCH_CUDA_ARCH_LIST the user set wins."""
    from ortft.env import cuda_extensions

    seen = []

    def run(cmd, cwd, env, what):
        seen.append(env)
        (cwd.parent / "build" / "lib.x").mkdir(parents=True, exist_ok=True)
        (cwd.parent / "build" / "lib.x" / f"fused_ops{SO}").write_bytes(b"\0")

    monkeypatch.setenv("CUDA_HOME", str(_fake_nvcc(tmp_path, "12.4")))
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    cuda_extensions.build_fused_ops(fake_dir, tmp_path / "b1", run)
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0")
    cuda_extensions.build_fused_ops(fake_dir, tmp_path / "b2", run)
    assert [env["TORCH_CUDA_ARCH_LIST"] for env in seen] == ["7.0;7.5;8.0;8.6;8.9;9.0", "8.0"]
    assert (fake_dir / f"fused_ops{SO}").is_file()


def test_fused_ops_refuses_the_cuda_13_nvcc_and_no_cuda_home(monkeypatch, tmp_path, fake_dir):
    """This machine's PATH nvcc is CUDA 13: never used, and named when it is CUDA_HOME."""
    from ortft.env import cuda_extensions

    monkeypatch.delenv("CUDA_HOME", raising=False)
    with pytest.raises(cuda_extensions.CudaBuildError, match="set CUDA_HOME to a CUDA 12.x"):
        cuda_extensions.build_fused_ops(fake_dir, tmp_path, None)
    monkeypatch.setenv("CUDA_HOME", str(_fake_nvcc(tmp_path, "13.0")))
    with pytest.raises(cuda_extensions.CudaBuildError, match="is CUDA 13.0; fused_ops needs"):
        cuda_extensions.build_fused_ops(fake_dir, tmp_path, None)
