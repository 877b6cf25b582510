"""``precision.dtype: auto``: bf16 where the hardware runs it natively, fp32 elsewhere, with
the reason on stderr and in summary.json; what ``ortft doctor`` says about bf16."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from conftest import assert_falls_like, overfit_classifier, write_recipe
from helpers import losses, run_cli
from typer.testing import CliRunner

from ortft.backends.torch import device as runtime
from ortft.cli.app import app
from ortft.env import hardware
from ortft.tools import doctor_verdicts

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_cpu_flags_are_read_from_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse avx512f avx512_bf16\n\nflags : other\n")
    assert hardware.cpu_flags(info) == {"fpu", "sse", "avx512f", "avx512_bf16"}
    assert hardware.cpu_flags(tmp_path / "absent") == set()
    assert hardware.cpu_bf16({"avx512f", "avx512_bf16", "amx_bf16"}) == ["amx_bf16", "avx512_bf16"]
    assert hardware.cpu_bf16({"avx512f"}) == []


@pytest.mark.parametrize(
    ("flags", "backend", "dtype", "words"),
    [
        (["avx512_bf16"], "torch", "bf16", "avx512_bf16"),
        (["amx_bf16"], "torch", "bf16", "amx_bf16"),
        (["avx512_bf16"], "ort", "fp32", "no bf16 training kernels"),
        ([], "torch", "fp32", "would be emulated"),
        (["avx512_bf16"], "ort-ondevice", "fp32", "fp32 only"),
    ],
)
def test_auto_on_cpu(monkeypatch, flags, backend, dtype, words):
    monkeypatch.setattr(hardware, "cpu_bf16", lambda: flags)
    chosen, reason = runtime.resolve_precision("auto", backend, CPU)
    assert chosen == dtype and words in reason


@pytest.mark.parametrize(
    ("cc", "dtype"), [((7, 0), "fp32"), ((7, 5), "fp32"), ((8, 0), "bf16"), ((9, 0), "bf16")]
)
def test_auto_on_cuda_follows_the_compute_capability(monkeypatch, cc, dtype):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: cc)
    for backend in ("torch", "ort"):  # ORT's CUDA provider has bf16 kernels
        chosen, reason = runtime.resolve_precision("auto", backend, CUDA)
        assert chosen == dtype and f"{cc[0]}.{cc[1]}" in reason


def test_a_dtype_the_recipe_names_is_kept():
    assert runtime.resolve_precision("fp32", "torch", CPU) == ("fp32", None)
    assert runtime.resolve_precision("bf16", "torch", CPU) == ("bf16", None)


def test_doctor_says_where_bf16_is_native():
    assert doctor_verdicts.bf16_check(["avx512_bf16"], []).verdict == doctor_verdicts.OK
    assert "8.6" in doctor_verdicts.bf16_check([], [(8, 6)]).value
    assert doctor_verdicts.bf16_check([], [(7, 0)]).verdict == doctor_verdicts.INFO


@pytest.fixture
def recipe(tmp_path: Path) -> Path:
    r = overfit_classifier(tmp_path)
    r["precision"] = {"dtype": "auto"}
    r["hardware"] = {"device": "cpu"}
    return write_recipe(tmp_path / "r.yaml", r)


def test_a_torch_run_records_the_choice_and_trains_in_it(recipe, tmp_path, monkeypatch):
    """The same recipe on a CPU with and without native bf16 (flags faked): the choice and its
    reason in summary.json and on stderr, and the losses show autocast really ran in bf16."""
    got = {}
    for flags, dtype in ((["avx512_bf16"], "bf16"), ([], "fp32")):
        monkeypatch.setattr(hardware, "cpu_bf16", lambda flags=flags: flags)
        out = tmp_path / dtype
        args = ["train", str(recipe), "backend.name=torch", "--output-dir", str(out)]
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 0, res.output
        precision = json.loads((out / "summary.json").read_text())["precision"]
        assert (precision["dtype"], precision["requested"]) == (dtype, "auto")
        assert precision["reason"] in res.stderr and f"precision: {dtype}" in res.stderr
        got[dtype] = losses(out)
    assert all(math.isfinite(v) for v in got["bf16"] + got["fp32"])
    assert got["bf16"] != got["fp32"]  # 8 bits of mantissa: not the fp32 numbers
    assert_falls_like(got["fp32"], got["bf16"], share=0.8)  # test_precision's bound


@pytest.mark.ort
def test_an_ort_run_on_cpu_stays_fp32_and_says_why(recipe, tmp_path):
    """In its own process (ORTModule in-process after other tests' exports misbehaves); on
    this CPU (avx512_bf16) the reason names ORT's missing bf16 kernels."""
    out = tmp_path / "ort"
    res = run_cli("train", str(recipe), "backend.name=ort", "--output-dir", str(out), timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    precision = json.loads((out / "summary.json").read_text())["precision"]
    assert (precision["dtype"], precision["requested"]) == ("fp32", "auto")
    assert precision["reason"].startswith("auto: ") and precision["reason"] in res.stderr
    if hardware.cpu_bf16():
        assert "no bf16 training kernels" in precision["reason"]


@pytest.mark.parametrize(
    ("fastest", "fixed"),
    [
        ("fp32", ["precision.dtype=fp32"]),
        ("bf16w", ["precision.dtype=bf16", "precision.weights=bf16"]),
    ],
)
def test_the_probe_weighs_fp32_and_bf16_weights_and_the_run_trains_what_it_chose(
    recipe, tmp_path, monkeypatch, fastest, fixed
):
    """Under precision.dtype and precision.weights auto on a bf16 CPU (flags faked), the probe
    times eager torch in bf16, fp32 and with bf16 weights; the alternative made fastest here
    (its probe steps scaled down) is what the run trains with, loss for loss the run that names
    that precision, and summary.json says so."""
    from ortft.backends.torch import auto

    monkeypatch.setattr(hardware, "cpu_bf16", lambda: ["avx512_bf16"])
    monkeypatch.setenv("ORTFT_CACHE", str(tmp_path / "cache"))  # no compile time known
    timed, warmed = auto._time_route, {}

    def _time_route(route, *args, **kwargs):
        warmed[route.label] = kwargs["warm"]
        times = timed(route, *args, **kwargs)
        return [t / 100 for t in times] if route.tag == fastest else times

    monkeypatch.setattr(auto, "_time_route", _time_route)
    out = tmp_path / "probed"
    args = ["train", str(recipe), "backend.name=torch", "backend.compile=auto",
            "precision.weights=auto", "--output-dir", str(out)]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    summary = json.loads((out / "summary.json").read_text())
    probe, precision = summary["backend"]["probe"], summary["precision"]
    compiled = f"torch+compile-{fastest}"  # in the precision of the fastest eager candidate
    assert set(probe["backends"]) == {"torch", "torch-fp32", "torch-bf16w", compiled}
    assert "too short" in probe["backends"][compiled]["skipped"]
    assert probe["route"] == f"torch-{fastest}"
    # the first eager candidate in each precision warmed its kernels on the same batches first
    assert warmed == {"torch": True, "torch-fp32": True, "torch-bf16w": False}
    for label in ("torch", "torch-fp32", "torch-bf16w"):  # each timed its 4 batches once
        assert len(probe["backends"][label]["sequence_lengths"]) == auto.PROBE_STEPS
    weights = "bf16" if fastest == "bf16w" else "fp32"
    assert (precision["dtype"], precision.get("weights", "fp32")) == (probe["dtype"], weights)
    assert (
        precision["reason"].startswith("auto: the probe timed")
        and precision["reason"] in res.stderr
    )
    ref = tmp_path / "fixed"
    res = CliRunner().invoke(app, ["train", str(recipe), "backend.name=torch", *fixed,
                                   "--output-dir", str(ref)])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert losses(out) == losses(ref)  # the probe left no trace: every RNG restored


def test_weights_auto_needs_the_probe(recipe):
    res = CliRunner().invoke(app, ["validate", str(recipe), "--set=precision.weights=auto",
                                   "--set=backend.name=torch"])  # fmt: skip
    assert res.exit_code == 2
    assert "precision.weights=auto is chosen by the probe" in res.output


def test_a_candidate_out_of_memory_is_recorded_and_the_others_weighed(
    recipe, tmp_path, monkeypatch
):
    """The fp32 candidate runs out of memory: the probe records why and trains with the rest."""
    from ortft.backends.torch import auto

    monkeypatch.setattr(hardware, "cpu_bf16", lambda: ["avx512_bf16"])
    monkeypatch.setenv("ORTFT_CACHE", str(tmp_path / "cache"))  # no compile time known
    timed = auto._time_route

    def _time_route(route, *args, **kwargs):
        if route.tag == "fp32":
            raise torch.OutOfMemoryError("out of memory: tried to allocate 2 GiB\nmore")
        return timed(route, *args, **kwargs)

    monkeypatch.setattr(auto, "_time_route", _time_route)
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["train", str(recipe), "backend.name=torch",
                                   "backend.compile=auto", "--output-dir", str(out)])  # fmt: skip
    assert res.exit_code == 0, res.output
    probe = json.loads((out / "summary.json").read_text())["backend"]["probe"]
    assert probe["backends"]["torch-fp32"]["error"] == "out of memory: tried to allocate 2 GiB"
    assert probe["route"] == "torch" and probe["dtype"] == "bf16"


def test_the_candidates_on_a_cpu_and_on_a_gpu(recipe, monkeypatch):
    """fp32 is weighed on a CPU only (a GPU's bf16 is the faster, and fp32 may not fit);
    bf16 weights wherever torch's own precision is bf16; none under backend.compile true."""
    from ortft.backends.torch import auto
    from ortft.recipe import io

    monkeypatch.setattr(hardware, "cpu_bf16", lambda: ["amx_bf16"])
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    sets = ["backend.name=auto", "backend.compile=auto", "precision.weights=auto"]
    r = io.load(recipe, sets).recipe
    labels = {d.type: [c.label for c in auto.routes(r, d)] for d in (CPU, CUDA)}
    assert labels["cpu"] == ["torch", "torch-fp32", "torch-bf16w", "torch+compile", "ort"]
    assert labels["cuda"] == ["torch", "torch-bf16w", "torch+compile", "ort"]
    r = io.load(recipe, [*sets[:2], "backend.compile=true"]).recipe
    assert [c.label for c in auto.routes(r, CPU)] == ["torch+compile", "ort"]


def test_the_probe_charges_a_one_off_only_where_the_run_pays_it_again():
    """An eager torch candidate's slow first step is the process warming a precision's kernels,
    paid by whichever candidate runs first: not charged, so two level candidates tie in either
    order. ORT's export and a compile are the route's own and are charged."""
    from ortft.backends.torch import auto

    autocast = auto.Route("torch", False, "bf16")
    bf16w = auto.Route("torch", False, "bf16", weights="bf16", tag="bf16w")
    warming, level = [0.065, 0.031, 0.030, 0.031], [0.030, 0.031, 0.030, 0.031]
    for first, later in ((autocast, bf16w), (bf16w, autocast)):
        a, b = (auto._figures(first, warming, [], 24), auto._figures(later, level, [], 24))
        assert (a["first_step_s"], a["one_off_s"]) == (0.065, 0.0)
        assert a["estimated_total_s"] == b["estimated_total_s"] == pytest.approx(0.031 * 24)
    for route in (auto.Route("torch", True, "bf16"), auto.Route("ort", False, "fp32")):
        figures = auto._figures(route, [2.0, 0.031, 0.030, 0.031], [], 24)
        assert figures["one_off_s"] == pytest.approx(1.969)
        assert figures["estimated_total_s"] == pytest.approx(1.969 + 0.031 * 24)
