"""`ortft doctor`: verdicts against each profile's known-good matrix (versions patched; the pins
read from the profile's lock file), and the real run on whichever profile this venv is."""

from __future__ import annotations

import json
import sys

import pytest
from helpers import run_cli
from typer.testing import CliRunner

from ortft.cli.app import app
from ortft.env import profiles
from ortft.tools import doctor, doctor_verdicts

runner = CliRunner()
ORT = doctor.load_stack(profiles.ORT, (3, 11))
CURRENT = doctor.load_stack(profiles.CURRENT, (3, 11))


def good_versions(stack: doctor.Stack = ORT, **changes: str | None) -> dict[str, str | None]:
    versions: dict[str, str | None] = dict(stack.known_good())
    versions.update({name: stack.want(name) for name in doctor.LOCKED_FEATURES})
    versions.update({name: None for name in doctor.EXTRAS})
    versions.update({name: "1.0" for name in doctor.DATA_PACKAGES})
    if stack.ort:
        versions.update({name: None for name in doctor.CONFLICTING_ORT})
        versions[doctor.ORT_CPU] = None
    versions.update(changes)
    return versions


def verdicts(versions: dict[str, str | None], stack: doctor.Stack = ORT) -> dict[str, doctor.Check]:
    return {check.name: check for check in doctor.check_versions(versions, stack)}


@pytest.mark.parametrize("stack", [ORT, CURRENT], ids=["ort", "current"])
def test_known_good_stack_is_ok(stack):
    checks = verdicts(good_versions(stack), stack)
    for name in stack.known_good():
        assert checks[name].verdict == doctor.OK, checks[name]
    assert doctor.exit_code(list(checks.values())) == 0


def test_known_good_comes_from_each_profiles_lock():
    """One source of truth: the versions doctor holds good are the lock files' pins."""
    assert ORT.known_good() == {
        "torch": "2.6.0", "onnxruntime-training": "1.19.2", "torch-ort": "1.19.2",
        "onnx": "1.17.0", "transformers": "5.24.0",
    }  # fmt: skip
    assert CURRENT.known_good() == {name: profiles.pins(profiles.CURRENT)[name]
                                    for name in ("torch", "onnxruntime", "onnx", "transformers")}  # fmt: skip
    py312 = doctor.load_stack(profiles.ORT, (3, 12))
    assert py312.lock is not None and py312.lock.name == "lock-py312.txt"
    assert py312.known_good()["onnxruntime-training"] == "1.19.2"  # the -cpu build's pin
    assert py312.known_good()["torch-ort"] == "1.19.2"  # from requirements/torch-ort.txt


def test_the_current_profile_takes_its_own_torch_and_onnx():
    """torch 2.13 and onnx 1.23 break ORTModule, but they are the current profile's stack."""
    checks = verdicts(good_versions(CURRENT), CURRENT)
    assert "onnxruntime-training" not in checks and "torch-ort" not in checks
    assert verdicts(good_versions(ORT, torch=CURRENT.want("torch")))["torch"].verdict == doctor.FAIL
    older = verdicts(good_versions(CURRENT, torch="2.12.0"), CURRENT)["torch"]
    assert older.verdict == doctor.WARN
    assert older.fix == f"pip install torch=={CURRENT.want('torch')}"
    missing = verdicts(good_versions(CURRENT, onnxruntime=None), CURRENT)["onnxruntime"]
    assert missing.verdict == doctor.FAIL


def test_tensorboard_is_held_to_the_lock_that_installs_it():
    for stack in (ORT, CURRENT):
        check = verdicts(good_versions(stack, tensorboard=None), stack)["tensorboard"]
        assert check.verdict == doctor.WARN and "the lock installs it" in check.value
        assert check.fix == f"pip install tensorboard=={stack.want('tensorboard')}"
        other = verdicts(good_versions(stack, tensorboard="2.0.0"), stack)["tensorboard"]
        assert other.verdict == doctor.WARN


def test_without_a_lock_file_doctor_says_it_cannot_check_pins(monkeypatch, tmp_path):
    monkeypatch.setattr(profiles, "requirement_dirs", lambda: [tmp_path / "requirements"])
    with pytest.raises(profiles.NoLockFile):
        profiles.pins(profiles.CURRENT)
    stack = doctor.load_stack(profiles.CURRENT, (3, 11))
    assert stack.pins == {} and stack.lock is None
    row = doctor.profile_check(stack, None)
    assert row.verdict == doctor.WARN and "cannot check pins" in row.value
    checks = verdicts(good_versions(CURRENT), stack)  # nothing to compare: no false warning
    assert checks["torch"].verdict == doctor.OK
    missing = verdicts(good_versions(CURRENT, torch=None), stack)["torch"]
    assert missing.fix == "pip install torch"  # no version to name
    assert doctor.headline(stack).endswith("no lock file found)")


def test_the_lock_inside_the_package_comes_first(monkeypatch, tmp_path):
    """A wheel carries the locks in ortft/requirements/; an editable install has the
    checkout's requirements/ beside the package."""
    inside, beside = tmp_path / "ortft" / "requirements", tmp_path / "requirements"
    for folder, version in ((inside, "9.9.9"), (beside, "1.0.0")):
        folder.mkdir(parents=True)
        (folder / "lock-current.txt").write_text(f"# pins\ntorch=={version}  # why\n")
    monkeypatch.setattr(profiles.ortft, "__file__", str(tmp_path / "ortft" / "__init__.py"))
    assert profiles.pins(profiles.CURRENT) == {"torch": "9.9.9"}
    (inside / "lock-current.txt").unlink()
    assert profiles.pins(profiles.CURRENT) == {"torch": "1.0.0"}


def test_the_active_profile_follows_ort_training(monkeypatch):
    monkeypatch.setattr(profiles.ort_training, "installed", lambda: None)
    assert profiles.active() == profiles.CURRENT
    monkeypatch.setattr(profiles.ort_training, "installed", lambda: ("onnxruntime-training", "1"))
    assert profiles.active() == profiles.ORT


def test_parse_reads_pins_and_skips_the_rest():
    text = "# c\n-r other.txt\nFoo_Bar==1.2  # x\nbaz[extra]==3.0; python_version<'4'\nqux>=1\n"
    assert profiles.parse(text) == {"foo-bar": "1.2", "baz": "3.0"}


@pytest.mark.parametrize("stack", [ORT, CURRENT], ids=["ort", "current"])
def test_every_route_says_whether_it_runs_and_none_fails(stack):
    torch_only = doctor_verdicts.Routes(torch=True, inference=True)
    rows = {c.name: c for c in doctor.route_checks(stack, torch_only)}
    assert set(rows) == {f"route: {r}" for r in ("ort", "ort-ondevice", "torch", "auto", "export")}
    assert {c.verdict for c in rows.values()} <= {doctor.OK, doctor.INFO}
    assert rows["route: torch"].verdict == rows["route: export"].verdict == doctor.OK
    assert rows["route: ort"].verdict == doctor.INFO
    if stack.ort:
        assert "see the ORTModule lines" in rows["route: ort"].value
    else:
        assert rows["route: ort"].value == "needs the ort profile (onnxruntime-training)"
        assert (rows["route: ort"].fix or "").startswith("make setup")
    everything = doctor_verdicts.Routes(torch=True, ortmodule=True, ondevice=True, inference=True)
    rows = {c.name: c for c in doctor.route_checks(stack, everything)}
    assert {c.verdict for c in rows.values()} == {doctor.OK}
    assert "times torch and ort" in rows["route: auto"].value


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


def test_the_current_profile_runs_where_ort_training_has_no_wheel():
    current = doctor.check_platform((3, 13), "Darwin", "arm64", profiles.CURRENT)
    assert {c.verdict for c in current} == {doctor.OK}
    py314 = doctor.check_platform((3, 14), "Linux", "x86_64", profiles.CURRENT)[0]
    assert py314.verdict == doctor.WARN


def test_render_puts_the_fix_under_the_line():
    text = doctor.render(doctor.check_versions(good_versions(torch="2.7.0"), ORT), ORT)
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("fail  torch"))
    assert lines[at + 1].strip() == "fix: pip install torch==2.6.0 && ortft doctor --fix"
    assert lines[-1].startswith("summary:") and "1 fail" in lines[-1]


def test_a_missing_package_is_reported_not_raised(monkeypatch):
    monkeypatch.setitem(sys.modules, "onnx", None)  # makes `import onnx` raise ImportError
    checks = {c.name: c for c in doctor._probe_onnx(ORT)}
    assert checks["onnx import"].verdict == doctor.FAIL
    assert checks["onnx import"].fix == "pip install onnx==1.17.0"
    checks = {c.name: c for c in doctor._probe_onnx(CURRENT)}
    assert checks["onnx import"].fix == f"pip install onnx=={CURRENT.want('onnx')}"


def test_only_the_providers_ortft_uses_are_probed(monkeypatch):
    """onnxruntime lists providers it was built with (Azure, TensorRT...); ortft runs on CPU
    and CUDA only, so another provider's missing library is no finding."""
    import onnxruntime

    probed: list[str] = []
    listed = ["AzureExecutionProvider", "TensorrtExecutionProvider", "CPUExecutionProvider"]
    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: listed)
    monkeypatch.setattr(
        doctor,
        "_probe_provider",
        lambda name, *a: probed.append(name) or doctor.Check(name, "ok", ""),
    )
    monkeypatch.setattr(doctor, "_gpu_visible", lambda: False)
    doctor._probe_ort(CURRENT)
    assert probed == ["CPUExecutionProvider"]


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


# what each profile's report must have: the ort profile probes ORTModule, the current one says
# that the ort routes need the other profile
PROFILE_ROWS = {
    profiles.ORT: {"onnxruntime-training", "ORTModule import", "ORTModule extensions"},
    profiles.CURRENT: {"onnxruntime", "route: ort", "route: ort-ondevice"},
}


def test_real_doctor_json_parses_and_passes(real_report):
    assert real_report.exit_code == 0, real_report.output
    report = json.loads(real_report.stdout)
    assert report["exit_code"] == 0
    assert report["profile"] == profiles.active()
    assert report["known_good"] == doctor.live_stack().known_good() != {}
    bad = [c for c in report["checks"] if c["verdict"] in (doctor.WARN, doctor.FAIL)]
    assert {c["name"] for c in bad} == expected_warnings(), bad
    assert all(c["verdict"] == doctor.WARN for c in bad), bad
    names = {c["name"] for c in report["checks"]}
    assert {"profile", "torch", "onnx IR", "gpu", "route: torch"} <= names
    assert PROFILE_ROWS[report["profile"]] <= names


def test_real_doctor_text_has_no_warning_or_failure():
    result = runner.invoke(app, ["doctor"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    warned = {line.split()[1] + " " + line.split()[2] for line in lines if line.startswith("warn")}
    assert warned == expected_warnings(), lines
    assert not [line for line in lines if line.startswith("fail")]
    stack = doctor.live_stack()
    assert lines[0] == doctor.headline(stack)
    assert lines[-1].endswith(f"{len(warned)} warn, 0 fail: {doctor.verdict_line(stack, False)}")
    ort_route = "ok    route: ort" if stack.ort else "info  route: ort"
    assert any(line.startswith(ort_route) for line in lines)


def test_real_doctor_prints_no_library_banner_on_stderr():
    """A fresh process, as a user runs it: torch's cpp_extension says "No CUDA runtime is
    found, using CUDA_HOME=..." at import on a machine without CUDA; doctor keeps it out."""
    res = run_cli("doctor", timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.startswith(f"ortft doctor (the {profiles.active()} profile; known-good")
    assert not [line for line in res.stderr.splitlines() if "CUDA_HOME" in line], res.stderr


def test_broken_onnxruntime_fix_names_the_installed_ort_build(monkeypatch):
    """On Python 3.12 the reinstall must name the -cpu build: the other has no cp312 wheel."""
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # `import onnxruntime` now fails
    monkeypatch.setattr(doctor.ort_training, "installed", lambda: (doctor.ORT_CPU, "1.19.2"))
    (check,) = doctor._probe_ort()
    assert check.name == "onnxruntime import" and check.verdict == doctor.FAIL
    assert check.fix == "pip install --force-reinstall onnxruntime-training-cpu==1.19.2"


@pytest.mark.ort  # the extensions live inside onnxruntime.training
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


# the three classes of CPU the route advice tells apart, as /proc/cpuinfo would give them
FAKE_CPUS = {
    "amx": ("Intel(R) Xeon(R) Platinum 8480+", {"avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}),
    "avx512_bf16": ("AMD EPYC 9R14 96-Core Processor", {"avx512f", "avx512_bf16"}),
    "none": ("Intel(R) Xeon(R) CPU E5-2686 v4 @ 2.30GHz", {"avx2", "fma"}),
}


@pytest.fixture
def faked_cpu(monkeypatch):
    """The doctor's report (text) on a CPU of the class given, without probing the runtime."""

    def report(kind: str) -> str:
        model, flags = FAKE_CPUS[kind]
        monkeypatch.setattr(doctor, "cpu_model", lambda: model)
        monkeypatch.setattr(doctor.hardware, "cpu_flags", lambda: flags)
        monkeypatch.setattr(doctor, "probe_runtime", lambda stack, fix=False: [])
        return doctor.render(doctor.collect(versions=good_versions(), stack=ORT), ORT)

    return report


def _line(text: str, name: str) -> str:
    return next(line for line in text.splitlines() if line.split(None, 1)[1].startswith(name))


def test_doctor_names_the_faster_route_for_an_amx_cpu(faked_cpu):
    text = faked_cpu("amx")
    assert "AMX (amx_bf16, avx512_bf16)" in _line(text, "cpu class")
    fp32 = _line(text, "cpu fp32 route")
    assert "backend.name=torch:" in fp32 and "Intel Xeon with AMX" in fp32
    assert "59.0 vs 32.8" in fp32 and "docs/backends.md" in fp32
    bf16 = _line(text, "cpu bf16 route")
    assert "precision.dtype=bf16 precision.weights=bf16:" in bf16 and "94.7 vs 85.9" in bf16
    assert "not on this vendor's" not in text


def test_doctor_names_the_faster_route_for_an_avx512_bf16_cpu(faked_cpu):
    text = faked_cpu("avx512_bf16")
    assert "AVX-512 BF16 (avx512_bf16)" in _line(text, "cpu class")
    fp32 = _line(text, "cpu fp32 route")
    assert fp32.startswith("info") and "backend.name=auto (no single answer):" in fp32
    assert "1.59x" in fp32 and "2026-12-01 (CPU model not recorded)" in fp32
    bf16 = _line(text, "cpu bf16 route")
    pick = "backend.name=torch precision.dtype=bf16 precision.weights=bf16:"
    assert pick in bf16 and "AMD EPYC (Zen 4" in bf16
    assert "not on this vendor's" not in bf16


def test_doctor_says_what_was_not_measured(faked_cpu):
    text = faked_cpu("none")
    assert "no bf16 units (neither amx_bf16 nor avx512_bf16)" in _line(text, "cpu class")
    fp32 = _line(text, "cpu fp32 route")
    assert fp32.startswith("info") and "not measured on a CPU of this class" in fp32
    assert "backend.name=auto" in fp32
    assert "bf16 is emulated" in _line(text, "cpu bf16 route")
    # an AVX-512 BF16 CPU from Intel (Cooper Lake): the AMD figures, flagged as another vendor's
    intel = doctor.route_advice.advice("Intel(R) Xeon(R) Gold 6348H", {"avx512_bf16"})
    assert "measured on an AMD CPU, not on this vendor's" in intel[2].value
