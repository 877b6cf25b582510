"""Quality gates, CI reports, the wall-clock budget and the determinism switch."""

from __future__ import annotations

import json
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from conftest import tiny_classifier, write_classification_csv, write_recipe
from helpers import run_cli

from ortft.core.errors import UsageError
from ortft.run import gates
from ortft.tools import ci_report

SUMMARY = {
    "status": "completed",
    "metrics": {"train_loss": 0.4, "eval_accuracy": 0.92, "eval_loss": 0.3},
    "throughput": {"samples_per_s": 25.0},
    "export": {"parity": {"max_abs_diff": 1e-6}},
    "steps": 10,
    "wall_time_s": 12.5,
    "backend": {"requested": "ort", "used": "ort", "fallback": False, "ort_exports": 2},
    "provenance": {"packages": {"torch": "2.6.0"}, "recipe_sha256": "ab" * 32},
}


@pytest.mark.parametrize(
    ("text", "passed"),
    [
        ("eval.accuracy>=0.90", True),
        ("eval.accuracy>=0.95", False),
        ("train.loss<=0.5", True),
        ("train.loss<0.4", False),
        ("throughput.samples_per_s>=20", True),
        ("export.max_abs_diff<=1e-4", True),
        ("steps==10", True),
        ("wall_time_s<10", False),
    ],
)
def test_gates_pass_and_fail_on_known_values(text: str, passed: bool) -> None:
    [result] = gates.check([gates.parse(text)], SUMMARY)
    assert result.passed is passed
    assert result.value is not None


def test_missing_metric_fails_with_a_reason() -> None:
    [result] = gates.check([gates.parse("eval.perplexity<=10")], SUMMARY)
    assert not result.passed and result.value is None
    assert "did not produce" in result.reason


@pytest.mark.parametrize("bad", ["accuracy", "eval.accuracy=>0.9", "eval.accuracy>=high", ">=1"])
def test_malformed_gate_is_a_usage_error(bad: str) -> None:
    with pytest.raises(UsageError, match="must look like"):
        gates.parse(bad)


def _with_gates(*texts: str) -> dict:
    return {
        **SUMMARY,
        "gates": gates.as_dicts(gates.check([gates.parse(t) for t in texts], SUMMARY)),
    }


def test_junit_report_structure() -> None:
    root = ET.fromstring(ci_report.junit(_with_gates("eval.accuracy>=0.9", "train.loss<=0.1")))
    suite = root.find("testsuite")
    assert suite is not None
    assert suite.get("tests") == "3" and suite.get("failures") == "1" and suite.get("errors") == "0"
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == [
        "training run",
        "eval.accuracy>=0.9",
        "train.loss<=0.1",
    ]
    assert cases[2].find("failure") is not None and cases[1].find("failure") is None


def test_junit_marks_a_failed_run_as_error() -> None:
    root = ET.fromstring(ci_report.junit({**SUMMARY, "status": "failed", "error": "boom"}))
    suite = root.find("testsuite")
    assert suite.get("errors") == "1"
    assert suite.find("testcase/error").get("message") == "boom"


def test_markdown_report_names_every_gate() -> None:
    text = ci_report.markdown(_with_gates("eval.accuracy>=0.9", "train.loss<=0.1"))
    assert "`eval.accuracy>=0.9`" in text and "`train.loss<=0.1`" in text
    assert "❌ fail" in text and "✅ pass" in text
    assert "torch 2.6.0" in text


def test_markdown_report_names_the_ort_training_build() -> None:
    def versions(packages: dict) -> str:
        summary = {**SUMMARY, "provenance": {**SUMMARY["provenance"], "packages": packages}}
        return ci_report.markdown(summary)

    assert "onnxruntime-training 1.19.2," in versions({"onnxruntime-training": "1.19.2"})
    cpu = {"onnxruntime-training": None, "onnxruntime-training-cpu": "1.19.2"}  # Python 3.12
    assert "onnxruntime-training 1.19.2 (-cpu)," in versions(cpu)
    assert "onnxruntime-training —," in versions({})


def test_report_suffix_is_checked() -> None:
    with pytest.raises(UsageError, match=".xml"):
        ci_report.check_paths([Path("report.txt")])


# --------------------------------------------------------------------------- end to end


def _train(*args: str) -> subprocess.CompletedProcess:
    return run_cli("train", *args, env={"NO_COLOR": "1"}, timeout=600)


@pytest.fixture
def torch_recipe(tmp_path: Path) -> Path:
    write_classification_csv(tmp_path / "train.csv")
    recipe = tiny_classifier("train.csv", backend="torch")
    recipe["export"] = {"enabled": False}
    return write_recipe(tmp_path / "r.yaml", recipe)


def test_train_gate_exit_codes_and_reports(torch_recipe: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    res = _train(
        str(torch_recipe),
        "--output-dir",
        str(run),
        "--gate",
        "eval.accuracy>=1.01",
        "--gate",
        "train.loss<=100",
        "--report",
        str(tmp_path / "j.xml"),
        "--report",
        str(tmp_path / "s.md"),
        "--json",
    )
    assert res.returncode == 3, res.stderr
    assert "gate FAIL  eval.accuracy" in res.stderr and "gate PASS  train.loss" in res.stderr
    summary = json.loads(res.stdout)  # --json still prints the summary on a failed gate
    assert [g["passed"] for g in summary["gates"]] == [False, True]
    assert json.loads((run / "summary.json").read_text())["gates"] == summary["gates"]
    suite = ET.parse(tmp_path / "j.xml").getroot().find("testsuite")
    assert suite.get("failures") == "1"
    assert "eval.accuracy>=1.01" in (tmp_path / "s.md").read_text()
    # re-running the finished run re-checks the gates from the recorded summary
    res = _train(str(torch_recipe), "--output-dir", str(run), "--gate", "train.loss<=100")
    assert res.returncode == 0, res.stderr


def test_recipe_gates_pass(torch_recipe: Path, tmp_path: Path) -> None:
    res = _train(str(torch_recipe), "gates=[train.loss<=100]", "--output-dir", str(tmp_path / "r"))
    assert res.returncode == 0, res.stderr
    assert "gate PASS  train.loss" in res.stderr


def test_malformed_gate_exits_2_before_training(torch_recipe: Path, tmp_path: Path) -> None:
    res = _train(str(torch_recipe), "--gate", "accuracy", "--output-dir", str(tmp_path / "r"))
    assert res.returncode == 2
    assert "must look like" in res.stderr and not (tmp_path / "r").exists()


def test_max_time_stops_and_leaves_a_resumable_checkpoint(
    torch_recipe: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    res = _train(
        str(torch_recipe),
        "training.max_steps=100000",
        "training.max_time=1",
        "--output-dir",
        str(run),
        "--json",
    )
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["status"] == "stopped" and summary["stop_reason"] == "max_time"
    assert 0 < summary["steps"] < 100000
    assert (run / "final" / "model.safetensors").exists()
    ckpt = run / f"step-{summary['steps']:06d}"
    assert (ckpt / "manifest.json").exists()
    # a stopped run is not finished: the next run resumes from that checkpoint
    res = _train(
        str(torch_recipe),
        "training.max_steps=100000",
        "training.max_time=1",
        "--output-dir",
        str(run),
        "--json",
    )
    assert res.returncode == 0, res.stderr
    again = json.loads(res.stdout)
    assert again["resumed_from"].endswith(ckpt.name) and again["steps"] > summary["steps"]


# `ortft train` in-process, then what the run left switched on in torch and in ORTModule
_TRAIN_THEN_REPORT = (
    "import sys; sys.argv = ['ortft', *sys.argv[1:]]\n"
    "from ortft.cli.app import main\n"
    "try:\n    main()\nfinally:\n"
    "    import torch\n"
    "    ortmodule = sys.modules.get('onnxruntime.training.ortmodule')\n"
    "    print('DETERMINISTIC', torch.are_deterministic_algorithms_enabled(),\n"
    "          getattr(ortmodule, 'ORTMODULE_IS_DETERMINISTIC', None), file=sys.stderr)\n"
)


def _train_reporting_determinism(*args: str) -> tuple[subprocess.CompletedProcess, str]:
    res = run_cli("train", *args, code=_TRAIN_THEN_REPORT, env={"NO_COLOR": "1"}, timeout=600)
    flags = [line for line in res.stderr.splitlines() if line.startswith("DETERMINISTIC ")]
    return res, flags[-1] if flags else "no DETERMINISTIC line"


@pytest.mark.ort
def test_deterministic_flag_reaches_torch_and_ortmodule(tmp_path: Path) -> None:
    """training.deterministic turns on torch's deterministic algorithms before the backend
    loads, so ORTModule copies the flag (its sessions then use deterministic compute); without
    it both stay off. Identical metrics alone cannot tell: on one CPU two runs are bitwise
    identical with or without the flag (measured), so that part is kept only as a cheap check."""
    write_classification_csv(tmp_path / "train.csv")
    recipe = tiny_classifier("train.csv", backend="ort", deterministic=True)
    recipe["model"]["dropout"] = 0.1
    recipe["export"] = {"enabled": False}
    path = write_recipe(tmp_path / "r.yaml", recipe)
    runs = {
        d: _train_reporting_determinism(str(path), "--output-dir", str(tmp_path / d), "--json")
        for d in "ab"
    }
    for res, flags in runs.values():
        assert res.returncode == 0, res.stderr[-3000:]
        assert flags == "DETERMINISTIC True True", flags
    sa, sb = (json.loads(runs[d][0].stdout) for d in "ab")
    assert sa["metrics"] == sb["metrics"]
    rows = [(tmp_path / d / "metrics.jsonl").read_text().splitlines() for d in "ab"]
    losses = [[json.loads(r)["loss"] for r in rs if '"train"' in r] for rs in rows]
    assert losses[0] == losses[1]
    res, flags = _train_reporting_determinism(
        str(path),
        "training.deterministic=false",
        "training.max_steps=1",
        "--output-dir",
        str(tmp_path / "off"),
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert flags == "DETERMINISTIC False False", flags
