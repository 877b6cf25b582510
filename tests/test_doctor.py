"""`ortft doctor`: verdicts against the known-good matrix (versions patched), and the real run."""

from __future__ import annotations

import json
import sys

import pytest
from helpers import run_cli
from typer.testing import CliRunner

from ortft.cli.app import app
from ortft.tools import doctor

runner = CliRunner()


def good_versions(**changes: str | None) -> dict[str, str | None]:
    versions: dict[str, str | None] = dict(doctor.KNOWN_GOOD)
    versions.update({name: None for name in doctor.EXTRAS})
    versions.update({name: "1.0" for name in doctor.DATA_PACKAGES})
    versions.update({name: None for name in doctor.CONFLICTING_ORT})
    versions[doctor.ORT_CPU] = None
    versions.update(changes)
    return versions


def verdicts(versions: dict[str, str | None]) -> dict[str, doctor.Check]:
    return {check.name: check for check in doctor.check_versions(versions)}


def test_known_good_stack_is_ok():
    checks = verdicts(good_versions())
    for name in doctor.KNOWN_GOOD:
        assert checks[name].verdict == doctor.OK, checks[name]
    assert doctor.exit_code(list(checks.values())) == 0


def test_local_version_suffix_is_still_known_good():
    assert verdicts(good_versions(torch="2.6.0+cu124"))["torch"].verdict == doctor.OK


@pytest.mark.parametrize("version", ["2.7.0", "2.8.0+cpu"])
def test_torch_27_breaks_the_extensions(version):
    check = verdicts(good_versions(torch=version))["torch"]
    assert check.verdict == doctor.FAIL
    assert "PyNode" in check.value
    assert check.fix == "pip install torch==2.6.0 && ortft doctor --fix"
    assert doctor.exit_code([check]) == 1


def test_torch_29_also_breaks_the_exporter():
    check = verdicts(good_versions(torch="2.9.1"))["torch"]
    assert check.verdict == doctor.FAIL
    assert "exporter" in check.value


def test_torch_below_26_fails_for_transformers():
    check = verdicts(good_versions(torch="2.5.1"))["torch"]
    assert check.verdict == doctor.FAIL
    assert "transformers" in check.value


def test_missing_torch_fails_with_the_install_command():
    check = verdicts(good_versions(torch=None))["torch"]
    assert check.verdict == doctor.FAIL
    assert "pip install torch==2.6.0" in (check.fix or "")


def test_onnx_118_writes_ir_versions_ort_refuses():
    check = verdicts(good_versions(onnx="1.18.0"))["onnx"]
    assert check.verdict in (doctor.FAIL, doctor.WARN)
    assert "IR" in check.value
    assert check.fix == "pip install onnx==1.17.0"


def test_other_transformers_is_a_warning_with_the_pin():
    check = verdicts(good_versions(transformers="5.25.0"))["transformers"]
    assert check.verdict == doctor.WARN
    assert check.fix == "pip install transformers==5.24.0"


def test_plain_onnxruntime_next_to_the_training_build_fails():
    check = verdicts(good_versions(onnxruntime="1.22.0"))["onnxruntime-training"]
    assert check.verdict == doctor.FAIL
    assert "pip uninstall -y onnxruntime" in (check.fix or "")


def test_the_cpu_build_alone_is_known_good():
    """Python 3.12's lock has onnxruntime-training-cpu instead of onnxruntime-training."""
    versions = good_versions(**{"onnxruntime-training": None, doctor.ORT_CPU: "1.19.2"})
    check = verdicts(versions)["onnxruntime-training"]
    assert check.verdict == doctor.OK and "onnxruntime-training-cpu" in check.value
    old = verdicts(good_versions(**{"onnxruntime-training": None, doctor.ORT_CPU: "1.18.0"}))
    assert old["onnxruntime-training"].fix == "pip install onnxruntime-training-cpu==1.19.2"


def test_both_ort_training_builds_installed_fails():
    check = verdicts(good_versions(**{doctor.ORT_CPU: "1.19.2"}))["onnxruntime-training"]
    assert check.verdict == doctor.FAIL
    assert "pip uninstall -y onnxruntime-training-cpu" in (check.fix or "")


def test_missing_optional_extra_is_info_not_a_warning():
    checks = verdicts(good_versions())
    for name in doctor.EXTRAS:
        assert checks[name].verdict == doctor.INFO
        assert checks[name].fix and name in checks[name].fix
    assert verdicts(good_versions(peft="0.21.2"))["peft"].verdict == doctor.OK


def test_platform_checks():
    assert {c.verdict for c in doctor.check_platform((3, 11), "Linux", "x86_64")} == {doctor.OK}
    assert doctor.check_platform((3, 12), "Linux", "x86_64")[0].verdict == doctor.OK
    py313 = doctor.check_platform((3, 13), "Linux", "x86_64")[0]
    assert py313.verdict == doctor.FAIL and py313.fix and "3.11 and 3.12" in py313.value
    mac = doctor.check_platform((3, 11), "Darwin", "arm64")[1]
    assert mac.verdict == doctor.FAIL


def test_render_puts_the_fix_under_the_line():
    text = doctor.render(doctor.check_versions(good_versions(torch="2.7.0")))
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("fail  torch"))
    assert lines[at + 1].strip() == "fix: pip install torch==2.6.0 && ortft doctor --fix"
    assert lines[-1].startswith("summary:") and "1 fail" in lines[-1]


def test_a_missing_package_is_reported_not_raised(monkeypatch):
    monkeypatch.setitem(sys.modules, "onnx", None)  # makes `import onnx` raise ImportError
    checks = {c.name: c for c in doctor._probe_onnx()}
    assert checks["onnx import"].verdict == doctor.FAIL
    assert checks["onnx import"].fix == "pip install onnx==1.17.0"


# --------------------------------------------------------------------------- the real machine


@pytest.fixture(scope="module")
def real_report():
    result = runner.invoke(app, ["doctor", "--json"])
    return result


def expected_warnings() -> set[str]:
    """The GPU profile on a machine without a GPU warns that the CUDA extensions are not built
    (they cannot be here: no CUDA 12 nvcc); the CPU profile warns about nothing."""
    from ortft.env import cudalibs

    return {"CUDA extensions"} if cudalibs.installed() and not doctor._gpu_visible() else set()


def test_real_doctor_json_parses_and_passes(real_report):
    assert real_report.exit_code == 0, real_report.output
    report = json.loads(real_report.stdout)
    assert report["exit_code"] == 0
    bad = [c for c in report["checks"] if c["verdict"] in (doctor.WARN, doctor.FAIL)]
    assert {c["name"] for c in bad} == expected_warnings(), bad
    assert all(c["verdict"] == doctor.WARN for c in bad), bad
    names = {c["name"] for c in report["checks"]}
    assert {"torch", "onnxruntime-training", "ORTModule extensions", "onnx IR", "gpu"} <= names


def test_real_doctor_text_has_no_warning_or_failure():
    result = runner.invoke(app, ["doctor"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    warned = {line.split()[1] + " " + line.split()[2] for line in lines if line.startswith("warn")}
    assert warned == expected_warnings(), lines
    assert not [line for line in lines if line.startswith("fail")]
    assert any(line.startswith("ok    ORTModule extensions") for line in lines)
    assert lines[-1].endswith(f"{len(warned)} warn, 0 fail: ORT training should work here")


def test_real_doctor_prints_no_library_banner_on_stderr():
    """A fresh process, as a user runs it: torch's cpp_extension says "No CUDA runtime is
    found, using CUDA_HOME=..." at import on a machine without CUDA; doctor keeps it out."""
    res = run_cli("doctor", timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.startswith("ortft doctor (known-good:")
    assert not [line for line in res.stderr.splitlines() if "CUDA_HOME" in line], res.stderr


def test_broken_onnxruntime_fix_names_the_installed_ort_build(monkeypatch):
    """On Python 3.12 the reinstall must name the -cpu build: the other has no cp312 wheel."""
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # `import onnxruntime` now fails
    monkeypatch.setattr(doctor.ort_training, "installed", lambda: (doctor.ORT_CPU, "1.19.2"))
    (check,) = doctor._probe_ort()
    assert check.name == "onnxruntime import" and check.verdict == doctor.FAIL
    assert check.fix == "pip install --force-reinstall onnxruntime-training-cpu==1.19.2"


def test_fix_builds_the_missing_extensions_and_plain_doctor_does_not(monkeypatch):
    """--fix reaches the build (ensure_built, patched here: a real one takes minutes) when
    the extensions are missing; without it doctor only reports them missing."""
    from ortft.env import extensions

    built: list[bool] = []
    missing = extensions.Status("/ext", False, "k", ["fused_adam"], [], ["fused_adam"])
    done = extensions.Status("/ext", True, "k", ["fused_adam"], ["fused_adam"])
    monkeypatch.setattr(extensions, "status", lambda: done if built else missing)
    monkeypatch.setattr(extensions, "ensure_built", lambda: built.append(True) or done)
    monkeypatch.setattr(extensions, "check_loads", lambda: None)

    def extension_check(*args: str) -> dict:
        report = json.loads(runner.invoke(app, ["doctor", "--json", *args]).stdout)
        return next(c for c in report["checks"] if c["name"] == "ORTModule extensions")

    plain = extension_check()
    assert plain["verdict"] == doctor.FAIL and "not built: fused_adam" in plain["value"]
    assert built == []
    fixed = extension_check("--fix")
    assert built == [True] and fixed["verdict"] == doctor.OK
    assert fixed["value"] == "fused_adam in /ext"
