"""`ortft bench` and `backend.name: auto` on tiny models. No timed assertions: only the fields,
the ratios' arithmetic and the losses."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path

import pytest
from helpers import losses, run_cli
from torch import __version__ as torch_version
from typer.testing import CliRunner

from ortft.cli.app import app
from ortft.core.errors import EXIT_USAGE, UsageError
from ortft.tools import bench, bench_report, flops, limit


def cli(*args: str) -> subprocess.CompletedProcess:
    # a real process: ORTModule redirects the OS-level stdout/stderr while it exports
    return run_cli(*args, env={"NO_COLOR": "1"}, timeout=900)


@pytest.mark.ort
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
    # the measured limit's 2048³ square (seconds of matmuls) from a planted cache: the run
    # reads it and measures only the tiny model's own GEMMs
    key = limit.cache_key("cpu", limit.device_name("cpu"), os.cpu_count() or 1, torch_version)
    square = {"2048x2048x2048": {"flops": 7e11}}
    limit.cache_path(key).parent.mkdir(parents=True, exist_ok=True)
    limit.cache_path(key).write_text(json.dumps({"key": key, "rates": {"fp32": square}}))
    res = cli(*args)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)  # stdout holds only the JSON
    assert "vs torch" in res.stderr  # the table goes to stderr
    assert out["baseline"] == "torch" and out["steps"] == 3 and out["repeats"] == 1
    assert out["peak"]["flops"] > 0 and out["machine"]["cores"] >= 1
    # the MFU denominator is the better of the two GEMM libraries the backends run
    libs = out["peak"]["by_library"]
    assert set(libs) == {"torch", "onnxruntime"} and out["peak"]["flops"] == max(libs.values())
    ort, torch = out["backends"]["ort"], out["backends"]["torch"]
    for r in (ort, torch):
        assert r["status"] == "ok"
        assert set(r["step_s"]) == {"median", "min", "max"}
        assert r["step_s"]["min"] <= r["step_s"]["median"] <= r["step_s"]["max"]
        assert r["samples_per_s"] > 0 and r["tokens_per_s"] > 0 and r["first_step_s"] > 0
        assert r["peak_rss_mb"] > 0 and 0 < r["mfu"] < 1 and r["parameters"] > 0
        assert len(r["per_repeat_median_step_s"]) == 1
        # real tokens and the shapes that ran: padding is counted, and only real tokens are useful
        assert 0 < r["padding_fraction"] < 1 and r["mfu"] < r["mfu_padded"]
        assert r["padded_tokens_per_s"] > r["tokens_per_s"] and r["mfu_above_100"] is False
        assert 8 <= r["mean_batch_length"] <= 16 and r["timed_steps"] == 2
    # the FLOP model: the tiny BERT's matmul weights, not its embeddings
    assert out["flop_model"] == {
        "per_token": 24576, "per_row": 1088, "layers": 2, "width": 32, "frozen": False,
    }  # fmt: skip
    # the measured limit: the square from the cache, the tiny model's GEMMs measured and cached
    lim = out["limit"]
    assert lim["threads"] == key["threads"] and lim["hidden"] == 32 and lim["intermediate"] == 128
    # both routes ran fp32: that is the one dtype measured
    assert set(lim["dtypes"]) == {"fp32"} and lim["dtypes"]["fp32"]["square_flops"] == 7e11
    assert 8 * 8 <= lim["tokens_per_micro_batch"] <= 8 * 16  # 8 rows × the mean length that ran
    cached = json.loads(limit.cache_path(key).read_text())["rates"]["fp32"]
    assert {g["shape"] for g in lim["dtypes"]["fp32"]["gemms"].values()} < set(cached)
    for r in (ort, torch):
        assert r["dtype"] == "fp32" and r["flops_per_s"] > 0
        assert r["limit_share"] == pytest.approx(r["flops_per_s"] / lim["dtypes"]["fp32"]["flops"])
    assert "of limit" in res.stderr
    assert out["warnings"] == [] and "pad %" in res.stderr and "MFU padded" in res.stderr
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
    assert v[1].overrides == {"backend.name": "torch", "backend.unpad": "false"}  # plain PyTorch
    assert v[1].env == {"ORTFT_TORCH_ATTN": "eager"}
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
    # ORTModule's own switches (padding elimination off, as make gpu-check measures it)
    v = bench.parse_variants("ort+ORTMODULE_ENABLE_EMBEDDING_SPARSE_OPTIMIZER=0,torch")
    assert v[0].env == {"ORTMODULE_ENABLE_EMBEDDING_SPARSE_OPTIMIZER": "0"}


def test_default_backends_are_routes_this_install_trains_on(monkeypatch) -> None:
    from ortft.tools import bench_variants

    monkeypatch.setattr(bench_variants.ort_training, "installed", lambda: None)
    assert [v.label for v in bench.parse_variants(None)] == ["torch", "torch-compile"]
    monkeypatch.setattr(
        bench_variants.ort_training, "installed", lambda: ("onnxruntime-training", "1")
    )
    assert [v.label for v in bench.parse_variants(None)] == ["ort", "torch"]


def test_bench_usage_errors_exit_2(cls_recipe: Path) -> None:
    runner = CliRunner()
    for args in (
        ["--steps", "2", "--warmup", "2"],
        ["--backends", "tensorflow"],
        ["--backends", "ort+training.bogus_key=1"],
    ):
        res = runner.invoke(app, ["bench", str(cls_recipe), *args])
        assert res.exit_code == EXIT_USAGE, res.output


def test_bench_timeout_kills_a_run_that_takes_longer(cls_recipe: Path, monkeypatch) -> None:
    """--timeout 0.5: the run (a fresh Python that imports torch) is killed and reported as
    timed out, exit 1; under the default 900 s it would finish. The machine's peak (seconds
    of matmuls, twice) is not what this checks: a fixed one stands in."""
    peak = {"flops": 1e9, "by_library": {"torch": 1e9}, "device": "cpu", "how": "fixed"}
    monkeypatch.setattr(flops, "measure_peak_flops", lambda device, threads: dict(peak))
    args = ["--backends", "torch", "--steps", "2", "--warmup", "1", "--repeats", "1"]
    res = CliRunner().invoke(app, ["bench", str(cls_recipe), *args, "--timeout", "0.5", "--json"])
    assert res.exit_code == 1, res.output
    out = json.loads(res.stdout)
    assert out["failed"] == ["torch"]
    assert out["backends"]["torch"]["status"] == "failed"
    assert out["backends"]["torch"]["error"].startswith("timed out")


@pytest.mark.ort
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
        # the probe times the batches the run trains on: data.padding=longest, not max_length
        assert len(timing["sequence_lengths"]) == probe["steps"]
        assert max(timing["sequence_lengths"]) < 16  # tiny_classifier: data.max_length 16
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
    assert losses(tmp_path / "auto") == pytest.approx(losses(tmp_path / "plain"), rel=1e-6)


@pytest.mark.ort
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
    assert losses(off) == pytest.approx(losses(on), rel=1e-5)


def _tiny_bert(tmp_path: Path) -> Path:
    from transformers import BertConfig

    BertConfig(
        vocab_size=200, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=128, num_labels=2,
    ).save_pretrained(tmp_path)  # fmt: skip
    return tmp_path


def test_flop_count_of_a_tiny_bert_by_hand(tmp_path: Path) -> None:
    fm = flops.from_saved(_tiny_bert(tmp_path), "AutoModelForSequenceClassification",
                          "sequence-classification")  # fmt: skip
    # per layer: Q, K, V, output 4 × 32 × 32 = 4096, MLP 32 × 128 × 2 = 8192; × 2 layers.
    # Once per row: the pooler 32 × 32 and the classifier 32 × 2. The 200 × 32 word, 512 × 32
    # position and 2 × 32 token-type embeddings are lookups: not counted.
    assert fm == flops.FlopModel(per_token=2 * (4096 + 8192), per_row=1024 + 64, layers=2, width=32)
    # a step of 8 rows padded to 16: 3 × (2 × 24576 × 8 × 16 + 2 × 1088 × 8 + 4 × 2 × 32 × 8 × 16²)
    assert fm.hardware(8, [16]) == 3 * (6_291_456 + 17_408 + 524_288) == 20_499_456
    # two micro-batches: each at its own length
    assert fm.hardware(8, [16, 8]) == fm.hardware(8, [16]) + fm.hardware(8, [8])
    # useful work: one row of 16 real tokens, seven of 8 (Σ l = 72, Σ l² = 256 + 7 × 64 = 704)
    assert fm.useful(8, 72, 704) == 3 * (2 * 24576 * 72 + 2 * 1088 * 8 + 4 * 2 * 32 * 704)
    assert fm.useful(8, 8 * 16, 8 * 16**2) == fm.hardware(8, [16])  # no padding: the same


def test_flop_count_keeps_a_tied_lm_head(tmp_path: Path) -> None:
    from transformers import GPT2Config

    GPT2Config(vocab_size=300, n_embd=32, n_layer=2, n_head=2).save_pretrained(tmp_path)
    fm = flops.from_saved(tmp_path, "AutoModelForCausalLM", "causal-lm")
    # per layer: c_attn 32 × 96, c_proj 32 × 32, c_fc 32 × 128, c_proj 128 × 32; the LM head
    # shares the 300 × 32 embedding's weights but is a matmul at every position
    assert fm == flops.FlopModel(per_token=2 * 12288 + 300 * 32, per_row=0, layers=2, width=32)


def _fake_run(fm_rows: list[dict], step_time: float) -> bench.RunResult:
    res = bench.RunResult("torch", 0, ok=True, first_step_s=1.0, loss=0.5, rss_mb=100.0)
    res.rows = [{**r, "step_time_s": step_time} for r in fm_rows]
    res.step_times = [step_time] * len(fm_rows)
    return res


def test_mfu_above_100_percent_is_flagged_not_clamped(capsys: pytest.CaptureFixture) -> None:
    fm = flops.FlopModel(per_token=24576, per_row=1088, layers=2, width=32)
    step = {"tokens": 72, "padded_tokens": 128, "batch_lengths": [16], "tokens_sq": 704}
    run = _fake_run([step] * 3, step_time=0.001)
    variant = bench.parse_variants("torch")[0]
    # a peak below what the steps reached: the useful work alone is 11,209,728 FLOPs per ms
    agg = bench._aggregate(variant, [run], 1, 8, fm, peak=5e9)
    assert agg["mfu"] == pytest.approx(fm.useful(8, 72, 704) / 0.001 / 5e9)
    assert agg["mfu"] > 2 and agg["mfu_padded"] > agg["mfu"] and agg["mfu_above_100"] is True
    assert agg["padding_fraction"] == pytest.approx(1 - 72 / 128)
    assert agg["tokens_per_s"] == pytest.approx(72 / 0.001)
    assert agg["samples_per_s"] == pytest.approx(8 / 0.001)
    warnings = bench._warnings({"torch": agg})
    assert len(warnings) == 1 and "above 100%" in warnings[0] and "measurement" in warnings[0]
    assert bench_report._pct(agg["mfu"]).endswith("% (!)")  # flagged in the table
    assert bench_report._pct(0.5) == "50.0%"
