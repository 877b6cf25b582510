"""torch-ort's GPU allocator extension, on a CPU-only machine: built by set-up from PyPI's CUDA
12.4 wheels (no nvcc), linked to torch's CUDA 12 runtime, importable, and the switch that turns
its use off (``backend.gpu_allocator``); ``adamw_ort_fused`` refused where fused_ops is absent.
The extensions live inside onnxruntime.training: the tests that need them are marked ``ort``."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

from ortft.core.errors import BackendError, InputError
from ortft.env import cuda_extensions, extensions

TORCH_LIB = Path(torch.__file__).parent / "lib"


def built_allocator() -> Path:
    ext_dir = extensions.extensions_dir()
    assert ext_dir is not None
    found = sorted(ext_dir.glob(f"{cuda_extensions.NAME}*.so"))
    assert found, f"make setup did not build {cuda_extensions.NAME} in {ext_dir}"
    return found[0]


@pytest.mark.ort
def test_set_up_built_the_allocator_against_cuda_12():
    """readelf: it needs libcudart.so.12, not 13 (this machine's PATH nvcc is CUDA 13.0); ldd:
    libc10_cuda.so is torch's own; no path of a system CUDA toolkit went into it."""
    so = built_allocator()
    needed = cuda_extensions.needed(so)
    assert [lib for lib in needed if lib.startswith("libcudart")] == ["libcudart.so.12"]
    assert "libc10_cuda.so" in needed
    resolved = cuda_extensions.resolved(so)
    assert Path(resolved["libc10_cuda.so"]).parent == TORCH_LIB.resolve()
    assert "nvidia/cuda_runtime/lib" in resolved["libcudart.so.12"]
    assert b"/usr/local/cuda" not in so.read_bytes()  # its debug info names every include dir


@pytest.mark.ort
def test_it_imports_after_torch_and_its_addresses_lie_inside_it():
    probe = cuda_extensions.probe_addresses()
    assert "error" not in probe, probe
    assert set(probe["functions"]) == set(cuda_extensions.FUNCTIONS)
    for name, info in probe["functions"].items():
        assert os.path.realpath(info["file"]) == os.path.realpath(built_allocator()), name
    assert cuda_extensions.inspect(built_allocator()) == []


@pytest.mark.ort
def test_the_build_takes_the_wheel_tree_whatever_nvcc_the_path_holds(monkeypatch, tmp_path):
    """CUDA_HOME and CUDA_PATH point at the tree made from the wheels even when the caller's
    environment names CUDA 13's; the tree has crt/ and a libcudart link name."""
    monkeypatch.setenv("CUDA_HOME", "/usr/local/cuda-13.0")
    monkeypatch.setenv("CUDA_PATH", "/usr/local/cuda-13.0")
    monkeypatch.setenv("PATH", "/usr/local/cuda-13.0/bin:" + os.environ["PATH"])
    ext_dir = extensions.extensions_dir()
    seen = {}

    def run(cmd, cwd, env, what):
        seen.update(cmd=cmd, env=env)
        out = cwd.parent / "build" / "lib.x"
        out.mkdir(parents=True)
        (out / f"{cuda_extensions.NAME}.cpython-311-x86_64-linux-gnu.so").write_bytes(b"\0")

    fake_ext = tmp_path / "ext"
    (fake_ext / "cuda").mkdir(parents=True)
    os.symlink(ext_dir / "cuda" / cuda_extensions.NAME, fake_ext / "cuda" / cuda_extensions.NAME)
    cuda_extensions.build(fake_ext, tmp_path / "build", run)
    home = Path(seen["env"]["CUDA_HOME"])
    assert home == tmp_path / "build" / cuda_extensions.NAME / "cuda_home"
    assert seen["env"]["CUDA_PATH"] == str(home)
    assert (home / "include" / "crt" / "host_defines.h").is_file()
    assert (home / "include" / "cuda_runtime_api.h").is_file()
    assert (home / "lib64" / "libcudart.so").resolve().name == "libcudart.so.12"
    assert "--no-as-needed -l:libcudart.so.12" in seen["env"]["LDFLAGS"]
    # the installed template stays as pip wrote it: the setup.py runs on a copy
    assert seen["cmd"][:2] == [sys.executable, "setup.py"]


# --------------------------------------------------------------------------- the switch


@pytest.fixture()
def gpu_without_the_allocator(monkeypatch):
    """A visible GPU (faked) and an allocator extension that cannot be imported."""
    from onnxruntime.training.ortmodule import options

    from ortft.backends.ortmodule import allocator

    init = options._RuntimeOptions.__init__
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setitem(sys.modules, allocator.MODULE, None)  # import -> ImportError
    monkeypatch.setenv("ORTMODULE_FALLBACK_POLICY", "FALLBACK_DISABLE")
    yield allocator
    options._RuntimeOptions.__init__ = init


def _construct():
    from onnxruntime.training.ortmodule import ORTModule

    return ORTModule(torch.nn.Linear(4, 2))


@pytest.mark.ort
def test_without_the_switch_ortmodule_on_a_gpu_needs_the_allocator(gpu_without_the_allocator):
    with pytest.raises(Exception, match="torch_gpu_allocator"):
        _construct()  # ORTModule's own constructor imports it: what every GPU run hits
    with pytest.raises(BackendError) as err:
        gpu_without_the_allocator.configure("torch", cuda=True)
    message = str(err.value)
    assert "\n" not in message and "backend.gpu_allocator=ort" in message


@pytest.mark.ort
def test_the_switch_lets_ortmodule_start_with_orts_own_arena(gpu_without_the_allocator):
    notes = gpu_without_the_allocator.configure("ort", cuda=True)
    assert notes == ["gpu_allocator=ort (ORT's BFC arena beside torch's pool)"]
    model = _construct()
    manager = model._torch_module._execution_manager(True)
    assert manager._runtime_options.use_external_gpu_allocator is False


def test_the_recipe_field_is_checked():
    from ortft.recipe.schema import BackendSection

    assert BackendSection().gpu_allocator == "torch"
    with pytest.raises(ValueError, match="gpu_allocator"):
        BackendSection(gpu_allocator="cuda")


# --------------------------------------------------------------------------- adamw_ort_fused


def test_adamw_ort_fused_is_refused_at_start_where_fused_ops_is_missing(monkeypatch, tmp_path):
    from ortft.backends.torch import device

    monkeypatch.setattr(extensions, "extensions_dir", lambda: tmp_path)
    with pytest.raises(InputError) as err:
        device.check_optimizer("adamw_ort_fused", torch.device("cuda"))
    message = str(err.value)
    assert "optimizer.name=adamw optimizer.implementation=fused" in message
    assert "--fused-ops" in message and "\n" not in message
    (tmp_path / "fused_ops.cpython-311-x86_64-linux-gnu.so").write_bytes(b"\0")
    device.check_optimizer("adamw_ort_fused", torch.device("cuda"))  # built: accepted
    with pytest.raises(InputError, match="needs CUDA"):
        device.check_optimizer("adamw_ort_fused", torch.device("cpu"))
    device.check_optimizer("adamw", torch.device("cpu"))


@pytest.mark.ort
def test_a_run_that_resolves_to_cpu_refuses_adamw_ort_fused_at_start(tmp_path):
    """hardware.device=auto passes validation (it may run on a GPU machine); the run's start
    on this CPU says why in one line, exit 2, before any model loads."""
    from test_cli_recipes import assert_clean_usage_error, invoke

    recipe = Path(__file__).resolve().parent.parent / "recipes" / "quickstart.yaml"
    result = invoke("train", recipe, "optimizer.name=adamw_ort_fused", "hardware.device=auto",
                    "--output-dir", tmp_path / "run")  # fmt: skip
    message = assert_clean_usage_error(result)
    assert "adamw_ort_fused needs CUDA" in message and "optimizer.name=adamw" in message
