"""The measured matmul limit (``ortft.tools.limit``) and the FLOP formulas it is divided into:
shapes, arithmetic, the cache. A tiny real measurement; no test asserts a speed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ortft.cli.app import app
from ortft.core.errors import EXIT_USAGE
from ortft.tools import flops, limit


def test_layer_gemms_are_the_full_fine_tune_flops_of_the_projections() -> None:
    d, ff, tokens = 32, 128, 8 * 16
    gemms = limit.layer_gemms(d, ff, tokens)
    # each projection's forward, input gradient and weight gradient: 3 × 2 × weights × tokens
    total = sum(g.flops * g.count for g in gemms)
    assert total == 3 * 2 * (4 * d * d + 2 * d * ff) * tokens
    # the same count as the MFU numerator's per-position weights (a layer of a tiny BERT)
    fm = flops.FlopModel(per_token=4 * d * d + 2 * d * ff, per_row=0, layers=1, width=d)
    assert total == fm.hardware(8, [16]) - 3 * 4 * d * 8 * 16**2  # less attention's scores
    # the layouts autograd runs: Wᵀ in the forward, dYᵀ in the weight's gradient
    up = {g.label: g for g in gemms if g.label.startswith("ffn-up")}
    assert (up["ffn-up fwd"].m, up["ffn-up fwd"].k, up["ffn-up fwd"].n) == (tokens, d, ff)
    assert (up["ffn-up dX"].m, up["ffn-up dX"].k, up["ffn-up dX"].n) == (tokens, ff, d)
    assert (up["ffn-up dW"].m, up["ffn-up dW"].k, up["ffn-up dW"].n) == (ff, tokens, d)
    assert up["ffn-up fwd"].key == f"{tokens}x{d}x{ff}-NT" and up["ffn-up dX"].key.count("-") == 0


def test_lora_counts_the_frozen_weights_forward_and_input_gradient_only() -> None:
    full = flops.FlopModel(per_token=24576, per_row=1088, layers=2, width=32)
    lora = flops.FlopModel(per_token=24576, per_row=1088, layers=2, width=32, frozen=True)
    # 4 × N × tokens for the frozen weights; the head (per row) and attention keep 3 × forward
    assert full.hardware(8, [16]) - lora.hardware(8, [16]) == 2 * 24576 * 8 * 16
    assert lora.useful(8, 128, 8 * 256) == (
        4 * 24576 * 128 + 3 * 2 * 1088 * 8 + 3 * 4 * 2 * 32 * 8 * 256
    )


def test_mix_rate_is_total_work_over_total_time() -> None:
    a, b = limit.Gemm("a", 10, 10, 10), limit.Gemm("b", 10, 10, 10, count=2, b_t=True)
    rates = {a.key: 1e9, b.key: 4e9}
    # a: 2,000 FLOPs at 1 GFLOP/s, 2 µs; b: 2 × 2,000 at 4 GFLOP/s, 1 µs: 6,000 FLOPs in 3 µs
    # (not the rates' mean, 2.5, nor their FLOP-weighted mean, 3)
    assert limit.mix_rate([a, b], rates) == pytest.approx(2e9)


def test_dims_default_ffn_is_four_times_hidden() -> None:
    from transformers import BertConfig, GPT2Config

    assert limit.dims(GPT2Config(n_embd=64)) == (64, 256)
    assert limit.dims(BertConfig(hidden_size=32, intermediate_size=100)) == (32, 100)


def test_measure_caches_per_machine_and_keeps_the_better_rate(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ORTFT_CACHE", str(tmp_path))
    gemms = limit.layer_gemms(16, 32, 8)
    # a real measurement, tiny: one repeat, a 32³ square
    first = limit.measure(gemms, "cpu", 1, repeats=1, square=32)
    key = {k: first[k] for k in ("device", "model", "threads", "torch")}
    assert key["threads"] == 1 and key["model"] and key["torch"]
    path = limit.cache_path(key)
    assert Path(first["cache"]) == path and path.parent == tmp_path / "limit"
    stored = json.loads(path.read_text())
    assert stored["key"] == key and set(stored["rates"]) == {"fp32", "bf16"}
    for dtype in ("fp32", "bf16"):
        r = first["dtypes"][dtype]
        assert set(r["gemms"]) == {g.label for g in gemms} and r["square_flops"] > 0
        assert r["flops"] == pytest.approx(
            limit.mix_rate(gemms, {v["shape"]: v["flops"] for v in r["gemms"].values()})
        )
    assert first["bf16_units"]  # the flags found, or a sentence saying there are none
    # cached: nothing is measured again
    calls: list[str] = []

    def fake(g: limit.Gemm, dtype: str, device: str, repeats: int) -> dict:
        calls.append(g.key)
        return {"flops": rate}

    monkeypatch.setattr(limit, "time_gemm", fake)
    rate = 1.0
    again = limit.measure(gemms, "cpu", 1, repeats=1, square=32)
    assert calls == [] and again["dtypes"] == first["dtypes"]
    # refresh: a slower measurement (a busier machine) does not replace a faster one
    limit.measure(gemms, "cpu", 1, repeats=1, square=32, refresh=True)
    assert calls and limit.measure(gemms, "cpu", 1, square=32)["dtypes"] == first["dtypes"]
    rate = 1e15  # a faster one does
    faster = limit.measure(gemms, "cpu", 1, repeats=1, square=32, refresh=True)
    assert faster["dtypes"]["fp32"]["flops"] == pytest.approx(1e15)
    # another thread count (or CPU, or torch) is another machine: another file
    other = limit.cache_path({**key, "threads": 2})
    assert other != path and other.parent == path.parent
    # a file whose key is not this machine's is no cache
    path.write_text(json.dumps({"key": {**key, "threads": 2}, "rates": stored["rates"]}))
    calls.clear()
    limit.measure(gemms, "cpu", 1, repeats=1, square=32)
    assert len(calls) == 2 * len({g.key for g in gemms} | {"32x32x32"})


def test_shares_are_achieved_flops_over_the_limit_in_the_route_dtype() -> None:
    measured = {"dtypes": {"fp32": {"flops": 100e9}, "bf16": {"flops": 400e9}}}
    results = {
        "torch": {"dtype": "fp32", "flops_per_s": 50e9, "flops_per_s_padded": 80e9},
        "torch-bf16": {"dtype": "bf16", "flops_per_s": 100e9, "flops_per_s_padded": 100e9},
        "whisper": {"dtype": "fp32", "flops_per_s": None, "flops_per_s_padded": None},
        "failed": {"status": "failed"},
    }
    limit.add_shares(results, measured)
    assert results["torch"]["limit_share"] == pytest.approx(0.5)
    assert results["torch"]["limit_share_padded"] == pytest.approx(0.8)
    assert results["torch-bf16"]["limit_share"] == pytest.approx(0.25)
    assert results["whisper"]["limit_share"] is None and results["failed"]["limit_share"] is None
    limit.add_shares(results, None)  # --limit off
    assert results["torch"]["limit_share"] is None


def test_limit_mode_is_checked_before_anything_runs(cls_recipe: Path) -> None:
    res = CliRunner().invoke(app, ["bench", str(cls_recipe), "--limit", "sometimes"])
    assert res.exit_code == EXIT_USAGE
    assert "--limit must be one of cached, refresh, off" in res.output
