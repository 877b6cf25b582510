"""ortft.env.extensions: what counts as built, and the cache outside the venv (no compiler needed)."""

from __future__ import annotations

import json
import sys

import pytest

from ortft.env import extensions

SO = ".cpython-311-x86_64-linux-gnu.so"


@pytest.fixture()
def fake_dir(tmp_path, monkeypatch):
    """A stand-in for onnxruntime's torch_cpp_extensions folder."""
    ext = tmp_path / "torch_cpp_extensions"
    for kind, name in [
        ("cpu", "aten_op_executor"),
        ("cpu", "torch_interop_utils"),
        ("cuda", "fused_ops"),
    ]:
        (ext / kind / name).mkdir(parents=True)
        (ext / kind / name / "setup.py").write_text("")
    monkeypatch.setattr(extensions, "extensions_dir", lambda: ext)
    monkeypatch.setenv("ORTFT_CACHE", str(tmp_path / "cache"))
    return ext


def test_nothing_built(fake_dir):
    state = extensions.status(cuda=False)
    assert not state.built
    assert state.expected == ["aten_op_executor", "torch_interop_utils"]
    assert state.missing == state.expected


def test_cpu_extensions_built(fake_dir):
    for name in ("aten_op_executor", "torch_interop_utils"):
        (fake_dir / f"{name}{SO}").write_bytes(b"\0")
    assert extensions.status(cuda=False).built
    # With a GPU the CUDA extensions are expected too.
    assert extensions.status(cuda=True).missing == ["fused_ops"]


def test_files_built_for_another_stack_are_stale(fake_dir):
    for name in ("aten_op_executor", "torch_interop_utils"):
        (fake_dir / f"{name}{SO}").write_bytes(b"\0")
    (fake_dir / extensions.MARKER).write_text(json.dumps({"key": "another"}))
    state = extensions.status(cuda=False)
    assert state.stale and not state.built


def test_cache_key_changes_with_the_stack():
    inputs = extensions.key_inputs(cuda=False)
    key = extensions.cache_key(inputs)
    assert key == extensions.cache_key(dict(inputs))
    assert key != extensions.cache_key({**inputs, "torch": "2.7.0"})
    assert key != extensions.cache_key({**inputs, "cuda": True})


def test_cache_key_names_the_python_and_the_ort_build(monkeypatch):
    """A 3.11 and a 3.12 venv (CUDA and -cpu ORT builds) never share cached extensions."""
    here = f"cpython-{sys.version_info.major}.{sys.version_info.minor}"
    monkeypatch.setattr(
        extensions.ort_training, "installed", lambda: ("onnxruntime-training", "1.19.2")
    )
    cuda_build = extensions.key_inputs(cuda=False)
    assert cuda_build["python"] == here and "ort-distribution" not in cuda_build
    cpu = ("onnxruntime-training-cpu", "1.19.2")
    monkeypatch.setattr(extensions.ort_training, "installed", lambda: cpu)
    cpu_build = extensions.key_inputs(cuda=False)
    assert cpu_build["onnxruntime-training"] == "1.19.2"
    assert extensions.cache_key(cpu_build) != extensions.cache_key(cuda_build)


def test_save_and_restore_round_trip(fake_dir, tmp_path):
    (fake_dir / f"aten_op_executor{SO}").write_bytes(b"built")
    inputs = extensions.key_inputs(cuda=False)
    saved = extensions._save(fake_dir, "k1", inputs)
    assert saved == tmp_path / "cache" / "extensions" / "k1"
    assert json.loads((saved / "inputs.json").read_text()) == inputs
    (fake_dir / f"aten_op_executor{SO}").unlink()
    restored = extensions._restore(fake_dir, saved)
    assert [p.name for p in restored] == [f"aten_op_executor{SO}"]
    assert (fake_dir / f"aten_op_executor{SO}").read_bytes() == b"built"


def test_no_onnxruntime_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(extensions, "extensions_dir", lambda: None)
    assert extensions.status(cuda=False).problem == "onnxruntime-training is not installed"
    with pytest.raises(extensions.ExtensionError, match="onnxruntime-training is not installed"):
        extensions.ensure_built()


def test_the_gpu_build_covers_v100_to_h100(monkeypatch, tmp_path):
    """The cached CUDA build must serve every GPU sharing the cache, not just the one it was
    built on; a TORCH_CUDA_ARCH_LIST the user set wins."""
    seen = []
    monkeypatch.setattr(
        extensions, "_run_logged", lambda cmd, cwd, env, log, what: seen.append(env)
    )
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    extensions._build_gpu(tmp_path, tmp_path / "log")
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0")
    extensions._build_gpu(tmp_path, tmp_path / "log")
    assert [env["TORCH_CUDA_ARCH_LIST"] for env in seen] == ["7.0;7.5;8.0;8.6;8.9;9.0", "8.0"]
