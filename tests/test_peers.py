"""benchmarks/peers.py, the one peer table: a busy round refused (or kept and marked with
--allow-busy), the table assembled from made-up rounds (refused rounds left out, the best peer,
the fastest fixed route, spreads, peak memory, the share of the measured limit), the rounds a
10% difference needs, and the Markdown. No training runs here; speed is the bench's to report."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from types import ModuleType

import helpers
import pytest

QUIET = {"load_avg": 1.0, "others_busy": 0.02}


@pytest.fixture
def table(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    return helpers.load_benchmark("peers_table", monkeypatch)


def _run(sps: float, share: float = 0.0, rss: float = 500.0, **more: object) -> dict:
    return {"ok": True, "samples_per_s": sps, "ms_per_step": 1000 * 16 / sps,
            "others_share": share, "peak_rss_mb": rss, "wall_s": 20.0, **more}  # fmt: skip


FAILED = {"ok": False, "others_share": 0.9, "wall_s": 3.0, "error": "exit 1: dynamo"}


def _limits(table: ModuleType, allow_busy: bool = False) -> object:
    return table.Limits(max_busy=0.2, max_load=3.0, others=0.1, allow_busy=allow_busy)


def test_a_busy_round_is_refused_and_says_why(table: ModuleType) -> None:
    runs = {"trainer": _run(10), "ort": _run(12, share=0.3), "trainer-compile": FAILED}
    busy_before = {"load_avg": 1.0, "others_busy": 0.5}
    loaded_after = {"load_avg": 6.5, "others_busy": 0.0}
    record = table.round_record(busy_before, loaded_after, runs, _limits(table))
    assert record["status"] == "refused: busy" and record["kept"] is False
    assert record["reasons"] == [
        "others took 50% of the CPU before the round (max 20%)",
        "load average 6.5 after the round (max 3.0)",
        "others took over 10% of the CPU during ort",  # not the failed run: its share is noise
    ]
    clean = table.round_record(QUIET, QUIET, {"trainer": _run(10), "ort": _run(12)}, _limits(table))
    assert clean["status"] == "clean" and clean["kept"] and clean["reasons"] == []


def test_allow_busy_keeps_a_busy_round_marked(table: ModuleType) -> None:
    runs = {"trainer": _run(10, share=0.5)}
    record = table.round_record(QUIET, QUIET, runs, _limits(table, allow_busy=True))
    assert record["kept"] and record["status"] == "busy, kept (--allow-busy)"
    assert record["reasons"] == ["others took over 10% of the CPU during trainer"]


def _task(table: ModuleType) -> dict:
    flops = {"per_sample": 2e9, "hidden": 384, "intermediate": 1536, "tokens_per_micro": 1024}

    def one(trainer: float, bf16: float, auto: float, ort: float, torch_bf16: float) -> dict:
        return {
            "trainer": _run(trainer, rss=900),
            "trainer-bf16": _run(bf16, rss=800, bf16=True),
            "auto": _run(auto, precision="bf16", ran_as="torch bf16", flops=flops),
            "ort": _run(ort, precision="fp32", rss=1200, flops=flops, backend_used="ort"),
            "torch-bf16": _run(torch_bf16, precision="bf16", flops=flops),
        }

    kept = [table.round_record(QUIET, QUIET, one(10, 20, 30, 15, 32), _limits(table)),
            table.round_record(QUIET, QUIET, one(10, 25, 36, 15, 36), _limits(table))]  # fmt: skip
    # a refused round with figures that would change every median, were it counted
    refused = table.round_record(
        {"load_avg": 9.0, "others_busy": 0.9}, QUIET, one(100, 1, 1, 1, 1), _limits(table)
    )
    return {"model": "MiniLM", "batch": 16, "peers": ["trainer", "trainer-bf16"],
            "ortft": ["auto", "ort", "torch-bf16"], "skipped": {},
            "rounds": [kept[0], refused, kept[1]],
            "limit": {"fp32": 100e9, "bf16": 400e9, "how": "torch.mm"}}  # fmt: skip


def test_table_summarizes_the_kept_rounds(table: ModuleType) -> None:
    s = table.summarize_task(_task(table))
    assert s["rounds_run"] == 3 and s["rounds_kept"] == 2
    assert s["best_peer"] == "trainer-bf16" and s["fastest_fixed"] == "torch-bf16"
    auto = s["routes"]["auto"]
    assert auto["samples_per_s"] == 33 and auto["samples_per_s_range"] == [30, 36]
    assert auto["spread"] == pytest.approx(6 / 33)
    assert auto["vs_best_peer"] == {"median": pytest.approx(1.47), "range": [1.44, 1.5]}
    assert s["auto_vs_fastest_fixed"]["range"] == [pytest.approx(30 / 32), 1.0]
    assert s["routes"]["ort"]["peak_rss_mb"] == 1200 and auto["ran_as"] == "torch bf16"
    assert s["routes"]["ort"]["ran_as"] == "ort fp32"
    # FLOP/s = samples/s x FLOPs a sample, over the limit in the dtype the route ran
    assert auto["limit_share"] == pytest.approx(33 * 2e9 / 400e9)
    assert s["routes"]["ort"]["limit_share"] == pytest.approx(15 * 2e9 / 100e9)
    assert s["routes"]["trainer-bf16"]["dtype"] == "bf16"
    spread = s["log_spread"]["auto_vs_fastest_fixed"]
    assert spread == pytest.approx(math.log(32 / 30) / math.sqrt(2))
    assert s["round_s"] == 100.0  # five runs of 20 s


def test_rounds_to_tell_ten_percent(table: ModuleType) -> None:
    assert table.rounds_needed(None) is None
    assert table.rounds_needed(0.01) == 3  # never fewer
    assert table.rounds_needed(0.1) == 9  # ((1.96 + 0.84) x 0.1 / ln 1.1)^2 = 8.6
    assert table.half_width(0.1, 9) == pytest.approx(math.exp(2.306 * 0.1 / 3) - 1)
    within = table.auto_verdict([0.98, 1.0, 1.02, 0.99])
    assert within["verdict"] == "auto within 10% of the fixed route"
    behind = table.auto_verdict([0.70, 0.72, 0.71])
    assert behind["verdict"] == "auto more than 10% slower than the fixed route"
    assert table.auto_verdict([0.8, 1.1])["verdict"] == "not told apart in 2 rounds"


def test_markdown_names_the_cpu_its_class_and_the_refused_round(
    table: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    peers = helpers.load_benchmark("peers", monkeypatch)
    machine = {"cpu": "AMD EPYC 9R14", "cores": 2, "bf16_flags": ["avx512_bf16"]}
    ort = {"tasks": {"text-short": _task(table)}, "machine": machine, "stopped": "exit -15",
           "versions": {"torch": "2.6.0", "onnxruntime": "1.19.2"}}  # fmt: skip
    parts = {"ort": ort, "current": {"skipped": "/x/python does not exist"}}
    a = argparse.Namespace(rounds=2, steps=20, warmup=4, quick=False, allow_busy=True,
                           max_busy=0.2, max_load=3.0)  # fmt: skip
    result = peers.assemble(parts, a)
    assert result["cpu_class"] == "bf16-capable (AVX-512 BF16)"
    assert result["hour"]["rounds_in_hour"] == 36  # 3600 s / a 100 s round
    text = table.markdown(result)
    assert "CPU: AMD EPYC 9R14, 2 cores; class: bf16-capable (AVX-512 BF16)." in text
    assert "**Machine loaded**" in text
    assert "| ort | text-short | trainer-bf16 (best peer) | bf16 | 22.5 |" in text
    assert "round 2 refused: busy: others took 90% of the CPU before the round" in text
    assert "- profile current skipped: /x/python does not exist" in text
    assert "- profile ort: exit -15; the tasks it finished are here" in text
    assert "- profile ort: torch 2.6.0, onnxruntime 1.19.2" in text
    assert table.cpu_class([]).startswith("no bf16 matmul units")
    assert peers.alternate(["t", "t-bf16", "t-c"], ["auto", "ort"]) == [
        "t", "auto", "t-bf16", "ort", "t-c"
    ]  # fmt: skip


def test_a_failed_run_reads_as_its_error(monkeypatch: pytest.MonkeyPatch) -> None:
    common = helpers.load_benchmark("peer_common", monkeypatch)
    wrapped = (
        "│ ❱ 48 │   from x import y │\n╰──────╯\nImportError: cannot import name 'utils' from \n"
        "'onnxruntime.training' \n(/venv/x/__init__.py)\n"
    )
    proc = argparse.Namespace(returncode=1, stderr=wrapped)
    assert common.failure(proc, 60) == (
        "exit 1: ImportError: cannot import name 'utils' from 'onnxruntime.training' "
        "(/venv/x/__init__.py)"
    )
    hinted = ("Traceback (most recent call last):\n  File \"x.py\", line 1\n"
              "torch._dynamo.exc.InternalTorchDynamoError: AttributeError: no is_exporting\n\n"
              "You can suppress this exception and fall back to eager by setting:\n"
              "    torch._dynamo.config.suppress_errors = True\n")  # fmt: skip
    assert common.failure(argparse.Namespace(returncode=1, stderr=hinted), 60) == (
        "exit 1: torch._dynamo.exc.InternalTorchDynamoError: AttributeError: no is_exporting"
    )  # the exception, not the hint after it
    plain = argparse.Namespace(returncode=2, stderr="loading\nerror: data.train: no such file\n")
    assert common.failure(plain, 60) == "exit 2: error: data.train: no such file"
    assert common.failure(None, 60) == "timed out after 60 s"


def test_a_run_reports_its_peak_memory_and_stops_at_its_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    common = helpers.load_benchmark("peer_common", monkeypatch)
    # held a moment: the peak is read while the process runs (processes.POLL_S)
    grow = (
        "import time; x = bytearray(300 * 2**20); x[::4096] = b'1' * len(x[::4096]); "
        "time.sleep(0.5); print('done')"
    )
    proc, shared = common.run_process([sys.executable, "-c", grow], timeout=60)
    assert proc.returncode == 0 and proc.stdout == "done\n"
    assert shared["peak_rss_mb"] > 300  # the child's own peak
    big = bytearray(400 * 2**20)  # this process holds 400 MB: exec carries it into ru_maxrss
    big[:: 2**12] = b"1" * len(big[:: 2**12])
    small = "import time; time.sleep(0.5); print('small')"
    proc, shared = common.run_process([sys.executable, "-c", small], timeout=60)
    assert proc.stdout == "small\n" and 0 < shared["peak_rss_mb"] < 100  # not this process's
    del big
    proc, shared = common.run_process([sys.executable, "-c", "import time; time.sleep(30)"], 1)
    assert proc is None and shared["wall_s"] < 20


def test_auto_vs_fixed_plans_its_rounds_from_the_tables_spread(
    table: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    peers = helpers.load_benchmark("peers", monkeypatch)
    common = sys.modules["peer_common"]
    summary = table.summarize_task(_task(table))  # auto / torch-bf16: 30/32, 36/36
    saved = {"profiles": {"ort": {"tasks": {"text-short": {"summary": summary}}}}}
    (tmp_path / "peers.json").write_text(json.dumps(saved))
    fake = common.TaskPeer("text-short", "m", 16, ("trainer",), ("auto", "torch-bf16"), None)
    monkeypatch.setattr(peers, "task_peers", lambda names: [fake])
    planned = []

    def run_task(peer: object, runners: list[str], a: argparse.Namespace, limits: object) -> list:
        planned.append((runners, a.rounds))
        one = {"auto": _run(35), "torch-bf16": _run(35)}
        return [table.round_record(QUIET, QUIET, one, limits) for _ in range(a.rounds)]

    monkeypatch.setattr(peers, "run_task", run_task)
    a = argparse.Namespace(table=tmp_path / "peers.json", profile="ort", tasks=None, rounds=5,
                           max_rounds=30, allow_busy=False)  # fmt: skip
    result = peers.auto_vs_fixed(a, _limits(table))
    # the table's log spread of auto / torch-bf16 (0.046) needs the minimum, 3 rounds
    assert planned == [(["auto", "torch-bf16"], 3)]
    got = result["tasks"]["text-short"]
    assert got["fixed"] == "torch-bf16" and got["planned_rounds"] == 3
    assert got["ratio"] == pytest.approx(1.0)
    assert got["verdict"] == "auto within 10% of the fixed route"


def test_tables_run_apart_merge_into_one(
    table: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    peers = helpers.load_benchmark("peers", monkeypatch)
    machine = {"cpu": "AMD EPYC", "cores": 2, "bf16_flags": []}
    a = argparse.Namespace(rounds=1, steps=3, warmup=2, quick=True, allow_busy=False,
                           max_busy=0.2, max_load=3.0)  # fmt: skip
    one = {"ort": {"tasks": {"image": _task(table)}, "machine": machine},
           "current": {"skipped": "not installed yet"}}  # fmt: skip
    two = {"current": {"tasks": {"image": _task(table)}, "machine": machine}}
    for name, parts in (("one", one), ("two", two)):
        (tmp_path / f"{name}.json").write_text(json.dumps(peers.assemble(parts, a)))
    a.allow_busy = True  # the merge takes the tables' own settings, not these
    merged = peers.merge([tmp_path / "one.json", tmp_path / "two.json"], a)
    assert list(merged["profiles"]) == ["ort", "current"]
    assert all("tasks" in p for p in merged["profiles"].values())
    assert merged["allow_busy"] is False and merged["rounds"] == 1
    text = table.markdown(merged)
    assert "| current | image | trainer-bf16 (best peer) |" in text and "skipped" not in text
    # the same profile run again on other tasks: its tasks join the earlier ones
    three = {"current": {"tasks": {"speech": _task(table)}, "machine": machine}}
    (tmp_path / "three.json").write_text(json.dumps(peers.assemble(three, a)))
    merged = peers.merge([tmp_path / n for n in ("one.json", "two.json", "three.json")], a)
    assert list(merged["profiles"]["current"]["tasks"]) == ["image", "speech"]


def test_every_run_of_a_bench_that_counts_its_work_carries_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    common = helpers.load_benchmark("peer_common", monkeypatch)
    work = {"per_sample": 7.0e8, "hidden": 192, "intermediate": 768, "tokens_per_micro": 2080}

    def ran(cmd: list[str], timeout: float, threads: int = 0) -> tuple[object, dict]:
        if "--result" in cmd:  # a peer's worker writes its result
            Path(cmd[cmd.index("--result") + 1]).write_text('{"samples_per_s": 30.0}')
        return argparse.Namespace(returncode=0, stdout="{}", stderr=""), {"wall_s": 1.0}

    monkeypatch.setattr(common, "run_process", ran)
    monkeypatch.setattr(common, "ortft_result", lambda *a: {"samples_per_s": 40.0})
    bench = common.Bench("b", "b.py", tmp_path / "r.yaml", 32, {}, "m", lambda *a: None)
    counted = common.replace(bench, work=lambda: work)
    for runner in ("trainer", "torch"):
        assert common.measure(counted, runner, 2, 1, tmp_path, 60)["flops"] == work
        assert "flops" not in common.measure(bench, runner, 2, 1, tmp_path, 60)


def test_the_image_and_embedding_peers_count_the_flops_by_hand(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    image = helpers.load_benchmark("peer_image", monkeypatch).work()
    # 4 layers of Q, K, V, O (192²) and the MLP (2 x 192 x 768), the 10-way head; 65 tokens
    weights, tokens = 4 * (4 * 192 * 192 + 2 * 192 * 768) + 192 * 10, 8 * 8 + 1
    assert image["per_sample"] == 3 * 2 * weights * tokens + 3 * 4 * 4 * 192 * tokens**2
    assert image["tokens_per_micro"] == 32 * tokens
    sentence = helpers.load_benchmark("peer_sentence", monkeypatch).work()
    # MiniLM-L6: 6 layers at 384/1536; two texts a pair, each at most 64 tokens
    per_token = 6 * (4 * 384 * 384 + 2 * 384 * 1536)
    assert sentence["hidden"] == 384 and sentence["intermediate"] == 1536
    low, high = 3 * 2 * per_token * 2 * 3, 3 * 2 * per_token * 128 + 3 * 4 * 6 * 384 * 2 * 64**2
    assert low < sentence["per_sample"] < high
    assert 32 * 3 <= sentence["tokens_per_micro"] <= 32 * 64


def test_runners_refuse_a_row_no_task_has() -> None:
    """--runners names the rows of a targeted comparison: one that none of the tasks has is a
    one-line usage error (exit 2) naming it and the rows there are, before anything runs."""
    import subprocess

    script = Path(__file__).parent.parent / "benchmarks" / "peers.py"
    bad = subprocess.run(
        [sys.executable, str(script), "--tasks", "image", "--runners", "torch-bf16,nope"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stderr
    assert bad.stderr.splitlines()[-1].startswith("peers.py: error: --runners: nope (known: ")
    assert "torch-bf16w" in bad.stderr.splitlines()[-1]


def test_auto_vs_fixed_runs_under_the_profiles_own_interpreter(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The targeted bench times auto under the table's profile (--profile), whose interpreter
    --profiles names; a profile it does not name is a usage error, not this interpreter's run."""
    peers = helpers.load_benchmark("peers", monkeypatch)
    p = peers.options()

    def python_of(*argv: str) -> str:
        a = p.parse_args(["--auto-vs-fixed", *argv])
        a.profiles = dict(x.split("=", 1) for x in a.profiles.split(","))
        return peers.profile_python(a, p)

    other = tmp_path / "bin" / "python"
    other.parent.mkdir()
    other.touch()
    assert python_of("--profile", "current", "--profiles", f"ort=/x,current={other}") == str(other)
    assert python_of() == os.path.abspath(sys.executable)  # the defaults: this=<this Python>
    for argv in (["--profile", "current"], ["--profile", "ort", "--profiles", "ort=/no/python"]):
        with pytest.raises(SystemExit) as exit_:
            python_of(*argv)
        assert exit_.value.code == 2
