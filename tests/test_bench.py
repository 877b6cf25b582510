"""`ortft bench` and `backend.name: auto` on tiny models. No timed assertions: only the fields,
the ratios' arithmetic and the losses."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import train_losses
from typer.testing import CliRunner

from ortft.cli import app
from ortft.errors import EXIT_USAGE, UsageError
from ortft.tools import bench


def cli(*args: str) -> subprocess.CompletedProcess:
    # a real process: ORTModule redirects the OS-level stdout/stderr while it exports
    return subprocess.run(
        [sys.executable, "-m", "ortft", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "NO_COLOR": "1"},
        timeout=900,
        check=False,
    )


def test_bench_reports_every_field_and_ratio(cls_recipe: Path, tmp_path: Path) -> None:
    png = tmp_path / "bench.png"
    want_plot = importlib.util.find_spec("matplotlib") is not None
    args = [
        "bench",
        str(cls_recipe),
        "--steps",
        "3",
        "--warmup",
        "1",
        "--repeats",
        "1",
        "--backends",
        "ort,torch",
        "--json",
    ] + (["--plot", str(png)] if want_plot else [])
    res = cli(*args)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)  # stdout holds only the JSON
    assert "vs torch" in res.stderr  # the table goes to stderr
    assert out["baseline"] == "torch" and out["steps"] == 3 and out["repeats"] == 1
    assert out["peak"]["flops"] > 0 and out["machine"]["cores"] >= 1
    ort, torch = out["backends"]["ort"], out["backends"]["torch"]
    for r in (ort, torch):
        assert r["status"] == "ok"
        assert set(r["step_s"]) == {"median", "min", "max"}
        assert r["step_s"]["min"] <= r["step_s"]["median"] <= r["step_s"]["max"]
        assert r["samples_per_s"] > 0 and r["tokens_per_s"] > 0 and r["first_step_s"] > 0
        assert r["peak_rss_mb"] > 0 and 0 < r["mfu"] < 1 and r["parameters"] > 0
        assert len(r["per_repeat_median_step_s"]) == 1
    # the ratio is the baseline's step time over this one's, pair by pair
    assert torch["ratio_vs_torch"] == pytest.approx(1.0)
    expected = torch["per_repeat_median_step_s"][0] / ort["per_repeat_median_step_s"][0]
    assert ort["ratio_vs_torch"] == pytest.approx(expected)
    # ORT really ran (it exported) and follows PyTorch's losses (dropout off)
    assert ort["backend_used"] == "ort" and ort["fallback"] is False and ort["ort_exports"] >= 1
    assert torch["ort_exports"] == 0
    assert ort["loss"] == pytest.approx(torch["loss"], rel=1e-4)
    assert out["failed"] == []
    if want_plot:
        assert png.read_bytes()[:4] == b"\x89PNG"


def test_parse_variants() -> None:
    v = bench.parse_variants(
        "ort+ORTFT_ORT_SPINNING=0+backend.compute_optimizer=false,torch-eager-attn"
    )
    assert v[0].label == "ort+ORTFT_ORT_SPINNING=0+backend.compute_optimizer=false"
    assert v[0].env == {"ORTFT_ORT_SPINNING": "0"}
    assert v[0].overrides == {"backend.name": "ort", "backend.compute_optimizer": "false"}
    assert v[1].overrides == {"backend.name": "torch"} and v[1].env == {"ORTFT_TORCH_ATTN": "eager"}
    for bad in ("tensorflow", "ort+PATH=/x", "ort+nokey", "ort,ort"):
        with pytest.raises(UsageError):
            bench.parse_variants(bad)
    # a bracketed list keeps its commas; GOMP_* is a thread-runtime variable like OMP_*
    v = bench.parse_variants("ort+backend.pytorch_kernels=[gelu,layer_norm]+GOMP_SPINCOUNT=5,torch")
    assert [x.label for x in v] == [
        "ort+backend.pytorch_kernels=[gelu,layer_norm]+GOMP_SPINCOUNT=5",
        "torch",
    ]
    assert v[0].overrides["backend.pytorch_kernels"] == "[gelu,layer_norm]"
    assert v[0].env == {"GOMP_SPINCOUNT": "5"}


def test_bench_usage_errors_exit_2(cls_recipe: Path) -> None:
    runner = CliRunner()
    for args in (
        ["--steps", "2", "--warmup", "2"],
        ["--backends", "tensorflow"],
        ["--backends", "ort+training.bogus_key=1"],
    ):
        res = runner.invoke(app, ["bench", str(cls_recipe), *args])
        assert res.exit_code == EXIT_USAGE, res.output


def test_auto_picks_a_backend_and_trains_as_it_would(cls_recipe: Path, tmp_path: Path) -> None:
    res = cli(
        "train",
        str(cls_recipe),
        "backend.name=auto",
        "export.enabled=false",
        "--output-dir",
        str(tmp_path / "auto"),
        "--json",
    )
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    b = summary["backend"]
    assert b["requested"] == "auto" and b["used"] in ("ort", "torch") and not b["fallback"]
    probe = b["probe"]
    assert probe["chosen"] == b["used"]
    assert set(probe["backends"]) == {"ort", "torch"}
    for timing in probe["backends"].values():
        assert timing["median_step_s"] > 0 and len(timing["step_times_s"]) == probe["steps"] - 1
    assert f"auto chose {b['used']}" in res.stderr
    # the probe leaves no trace: the same losses as a plain run on the chosen backend
    plain = cli(
        "train",
        str(cls_recipe),
        f"backend.name={b['used']}",
        "export.enabled=false",
        "--output-dir",
        str(tmp_path / "plain"),
    )
    assert plain.returncode == 0, plain.stderr
    assert train_losses(tmp_path / "auto") == pytest.approx(
        train_losses(tmp_path / "plain"), rel=1e-6
    )


def test_ort_trains_with_the_compute_optimizer_off(cls_recipe: Path, tmp_path: Path) -> None:
    """ORT 1.19.2 crashes at export with it off ('NoneType' object is not iterable); ortft patches
    that, so the recipe option (and the bench lever) works and matches the default's losses."""
    off, on = tmp_path / "off", tmp_path / "on"
    for run_dir, value in ((off, "false"), (on, "true")):
        res = cli(
            "train",
            str(cls_recipe),
            f"backend.compute_optimizer={value}",
            "training.max_steps=3",
            "export.enabled=false",
            "--output-dir",
            str(run_dir),
        )
        assert res.returncode == 0, res.stderr
    assert train_losses(off) == pytest.approx(train_losses(on), rel=1e-5)
