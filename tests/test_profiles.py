"""The two install profiles agree with the package (issue 48).

pyproject's extras, the locks (requirements/lock.txt and lock-py312.txt: the ort profile;
lock-current.txt: the current one) and ortft.env.extras name the same packages and versions;
onnxruntime and onnxruntime-training never share a lock. The clean-venv tests (marked
``profiles``, run by `make test-current`) install the built wheel with each extra into a new
venv, offline from the current profile's wheelhouse, and import what the extra promises.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

import pytest

from ortft.env import extras, profiles

ROOT = Path(__file__).resolve().parent.parent
REQUIREMENTS = ROOT / "requirements"
ORT_LOCKS = ("lock.txt", "lock-py312.txt")
CURRENT_LOCK = "lock-current.txt"


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _lock(name: str) -> dict[str, str]:
    return profiles.parse((REQUIREMENTS / name).read_text())


def _normal(name: str) -> str:
    return profiles.normalise(name)


def test_every_extra_is_known_to_the_error_lines() -> None:
    """An extra the CLI cannot name in its missing-package line would leave users guessing."""
    declared = set(_pyproject()["optional-dependencies"]) - {"dev"}
    assert declared == set(extras.EXTRAS)


def test_the_ort_extra_pins_what_the_ort_locks_pin() -> None:
    from packaging.requirements import Requirement

    pinned: dict[str, list[str]] = {}
    for line in _pyproject()["optional-dependencies"]["ort"]:
        requirement = Requirement(line)
        pinned.setdefault(_normal(requirement.name), []).append(str(requirement.specifier))
    for lock in ORT_LOCKS:
        pins = _lock(lock)
        for name in ("torch", "onnx"):
            assert pinned[name] == [f"=={pins[name]}"], (lock, name)
        training = pins.get("onnxruntime-training") or pins.get("onnxruntime-training-cpu")
        assert f"=={training}" in pinned["onnxruntime-training"]
        assert "onnxruntime" not in pins, (
            f"{lock} holds plain onnxruntime beside the training build"
        )


def test_the_current_lock_satisfies_the_base_and_the_runtime_extra() -> None:
    """pip install ortft[runtime] on the current lock's versions: every bound holds."""
    from packaging.requirements import Requirement

    pins = _lock(CURRENT_LOCK)
    assert "onnxruntime-training" not in pins and "torch-ort" not in pins
    project = _pyproject()
    for line in [*project["dependencies"], *project["optional-dependencies"]["runtime"]]:
        requirement = Requirement(line)
        name = _normal(requirement.name)
        assert name in pins, f"{CURRENT_LOCK} does not pin {name}"
        assert requirement.specifier.contains(pins[name], prereleases=True), (line, pins[name])


def test_the_ort_locks_satisfy_the_base() -> None:
    from packaging.requirements import Requirement

    for lock in ORT_LOCKS:
        pins = _lock(lock)
        for line in _pyproject()["dependencies"]:
            requirement = Requirement(line)
            version = pins.get(_normal(requirement.name))
            assert version and requirement.specifier.contains(version), (lock, line, version)


def test_requires_python_admits_every_profiles_python() -> None:
    from packaging.specifiers import SpecifierSet

    allowed = SpecifierSet(_pyproject()["requires-python"])
    for python in ("3.11", "3.12", "3.13"):  # ort: 3.11, 3.12; current: 3.11 to 3.13
        assert allowed.contains(python + ".0"), python
    assert not allowed.contains("3.10.0")


def test_a_missing_optional_package_is_one_line_naming_its_extra() -> None:
    from typer.testing import CliRunner

    from ortft.cli import common

    def needs_diffusers() -> None:
        raise ModuleNotFoundError("No module named 'diffusers'", name="diffusers")

    def a_bug() -> None:
        raise ModuleNotFoundError("No module named 'ortft.nothing'", name="ortft.nothing")

    import typer

    app = typer.Typer()
    app.command("one")(lambda: common.guarded(needs_diffusers))
    app.command("two")(lambda: common.guarded(a_bug))
    result = CliRunner().invoke(app, ["one"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "error: this needs diffusers, which is not installed: pip install 'ortft[diffusion]'"
    ]
    result = CliRunner().invoke(app, ["two"])  # ortft's own module: a bug, not an install hint
    assert isinstance(result.exception, ModuleNotFoundError)


# ---------------------------------------------------------------- clean venvs (make test-current)


# read at import, before conftest points ORTFT_CACHE at the session's own folder: make setup's
# wheelhouse is the user's
WHEELHOUSE = Path(os.environ.get("ORTFT_CACHE", Path.home() / ".cache" / "ortft")) / "wheels"


def _wheelhouse() -> Path:
    return WHEELHOUSE


@pytest.fixture(scope="module")
def ortft_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ortft's wheel, built from this checkout without the network (hatchling is in dev.txt)."""
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
         "-w", str(out), str(ROOT)],
        check=True, capture_output=True,
    )  # fmt: skip
    return next(out.glob("ortft-*.whl"))


def _python(folder: Path) -> str:
    venv.create(folder, with_pip=True)
    return str(folder / "bin" / "python")


def _pip(python: str, *args: str) -> None:
    offline = ["--no-index", "--find-links", str(_wheelhouse())]
    offline += [f"--find-links={d}" for d in _wheelhouse().glob("deepspeed-*") if d.is_dir()]
    command = [python, "-m", "pip", "--disable-pip-version-check", "install", *offline, *args]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def _imports(python: str, modules: tuple[str, ...]) -> dict[str, bool]:
    code = (
        "import importlib.util, json, sys\n"
        "def found(m):\n"
        "    try:\n"
        "        return importlib.util.find_spec(m) is not None\n"
        "    except ModuleNotFoundError:\n"
        "        return False\n"
        "print(json.dumps({m: found(m) for m in sys.argv[1:]}))\n"
    )
    done = subprocess.run([python, "-c", code, *modules], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.profiles
@pytest.mark.timeout(900)
def test_each_extra_installs_into_a_clean_venv_and_imports(
    ortft_wheel: Path, tmp_path: Path
) -> None:
    """The base, then each extra on top, from the current lock's wheels: the base has no ONNX
    Runtime (its CLI names the extra), each extra makes its modules importable."""
    torch = _lock(CURRENT_LOCK)["torch"]
    assert list(_wheelhouse().glob(f"torch-{torch}*.whl")), "make setup STACK=current first"
    python = _python(tmp_path / "venv")
    constraints = ["-c", str(REQUIREMENTS / CURRENT_LOCK)]
    _pip(python, *constraints, str(ortft_wheel))
    base = _imports(python, ("ortft", "torch", "transformers", "onnx", "onnxruntime"))
    assert base == {"ortft": True, "torch": True, "transformers": True, "onnx": True,
                    "onnxruntime": False}  # fmt: skip
    # runtime alone first (the extra most installs need); then the others in one pip call
    # (each pip call re-resolves the whole set: one per extra took minutes on 2 cores)
    rest = [e for e in extras.EXTRAS if e not in ("ort", "runtime")]
    for group in (["runtime"], rest):
        _pip(python, *constraints, f"ortft[{','.join(group)}] @ {ortft_wheel.as_uri()}")
        for extra in group:
            found = _imports(python, extras.EXTRAS[extra])
            assert all(found.values()), (extra, found)
    assert _imports(python, ("onnxruntime.training",)) == {"onnxruntime.training": False}
    doctor = subprocess.run(
        [str(tmp_path / "venv" / "bin" / "ortft"), "--help"], capture_output=True, text=True
    )
    assert doctor.returncode == 0, doctor.stderr


@pytest.mark.profiles
def test_the_ort_extra_resolves_to_the_training_build_alone(
    ortft_wheel: Path, tmp_path: Path
) -> None:
    """ortft[ort] from the ort profile's wheels: pip picks onnxruntime-training 1.19.2, torch
    2.6.0 and torch-ort, and never plain onnxruntime (both would install onnxruntime/)."""
    assert list(_wheelhouse().glob("onnxruntime_training-1.19.2-*.whl")), "make setup first"
    report = tmp_path / "report.json"
    python = "python3.11"
    command = [python, "-m", "pip", "--disable-pip-version-check", "install", "--dry-run",
               "--ignore-installed", "--no-index", "--find-links", str(_wheelhouse()),
               "--report", str(report), f"ortft[ort] @ {ortft_wheel.as_uri()}"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    chosen = {
        _normal(item["metadata"]["name"]): item["metadata"]["version"]
        for item in json.loads(report.read_text())["install"]
    }
    pins = _lock("lock.txt")
    for name in ("torch", "onnx", "onnxruntime-training", "torch-ort"):
        assert chosen.get(name) == pins[name], (name, chosen.get(name))
    assert "onnxruntime" not in chosen


# ------------------------------------------------- one run, both profiles (make test-current)

VENVS = {"ort": ROOT / ".venv", "current": ROOT / ".venv-current"}


def _ortft(profile: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``ortft ARGS`` in that profile's venv (its own packages: no PYTHONPATH from this one)."""
    from helpers import run_cli

    python = VENVS[profile] / "bin" / "python"
    assert python.exists(), f"{VENVS[profile]} is missing: make setup STACK={profile} first"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return run_cli(*args, python=python, base_env=env, cwd=cwd, timeout=300)


@pytest.mark.profiles
@pytest.mark.timeout(600)
@pytest.mark.parametrize(("first", "then"), [("ort", "current"), ("current", "ort")])
def test_a_run_moves_between_the_profiles(first: str, then: str, tmp_path: Path) -> None:
    """Trained on one profile (torch 2.6, or today's torch): the other resumes its checkpoint,
    evaluates its final/ and exports it with parity."""
    from conftest import tiny_classifier, write_classification_csv, write_recipe

    write_classification_csv(tmp_path / "train.csv", n=64)
    recipe = tiny_classifier("train.csv", backend="torch", max_steps=4)
    recipe["checkpoint"] = {"save_every": 2}
    recipe["data"]["eval_fraction"] = 0.25
    path = write_recipe(tmp_path / "r.yaml", recipe)
    done = _ortft(first, "train", str(path), "-o", "run", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-1500:]
    resumed = _ortft(
        then, "train", str(path), "training.max_steps=6", "-o", "resumed",
        f"checkpoint.resume={tmp_path / 'run' / 'step-000004'}", cwd=tmp_path,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-1500:]
    summary = json.loads((tmp_path / "resumed" / "summary.json").read_text())
    assert summary["steps"] == 6 and summary["resumed_from"].endswith("step-000004")
    evaluated = _ortft(then, "eval", "run", "--json", cwd=tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr[-1500:]
    assert "accuracy" in json.loads(evaluated.stdout)["metrics"]
    exported = _ortft(then, "export", "run", "-o", "exported", cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr[-1500:]
    report = json.loads((tmp_path / "exported" / "export.json").read_text())
    assert report["parity"]["passed"], report["parity"]
