"""One peer table for every task: each task's peer at its usual and fastest settings against
ortft's ``ort``, ``torch``, ``torch`` bf16 and ``auto``, on every profile, in one Markdown and
JSON table (``make bench-peers``; not in CI).

    python benchmarks/peers.py --rounds 3 --profiles ort=.venv/bin/python,current=.venv-current/bin/python
    python benchmarks/peers.py --quick --tasks text-short,image --allow-busy   # a smoke run
    python benchmarks/peers.py --auto-vs-fixed --table benchmarks/results/peers.json
    python benchmarks/peers.py --merge ort.json current.json --out benchmarks/results/peers

The tasks are the peer benches' (``PEERS``: each module's ``task_peers()`` gives its tasks, their
runners and how to measure one in a fresh process, ``peer_common.TaskPeer``): text short and
long against transformers' Trainer (fp32, ``bf16=True``, ``torch_compile=True``), image
classification (Trainer), speech recognition (Seq2SeqTrainer), sentence embeddings
(SentenceTransformerTrainer), DPO (TRL's DPOTrainer) and text-to-image (diffusers' training
step), image-text-to-text (a Trainer with the processor's collator), each at fp32 and bf16. Each profile (``--profiles NAME=PYTHON``; default: this Python
alone) runs in its own process of its own interpreter; a profile without ORT training (the
current one) leaves ``ort`` out and says so. ``auto`` runs wherever ortft runs.

A round runs every runner of a task once, peer and ortft settings alternating, in reverse order
every other round, each a fresh process. A round taken on a busy machine is refused (kept in the
JSON, left out of the table, and run again up to ``--retries`` times): others took more than
``--max-busy`` of the CPU in the second just before or just after it, or the 1-minute load
average then was above ``--max-load`` (default: cores + 1, as the bench's own last run still
counts in it), or others took more than ``peer_common.OTHERS`` of the CPU during one of its runs.
``--allow-busy`` keeps such rounds, marked, for a loaded development machine.

The table (``--out``.md and .json): per profile, task and route the median samples/s over the
kept rounds, their min-max, the median ratio to the best peer setting taken round by round, the
median ms/step, the peak resident memory of the run's process (``wait4``), and, where the task's
bench counts FLOPs (the text tasks: ``peer.work``), the route's achieved FLOP/s (its samples/s ×
the useful training FLOPs of a sample) as a share of this machine's measured matmul rate in the
dtype it ran, at the task's GEMM shapes (``ortft.tools.limit``); then the round time of every task,
the rounds that fit in an hour and the spread they leave.

``--merge`` writes tables run apart (a profile each) as one, running nothing.
``--auto-vs-fixed`` is the targeted bench: per task, ``auto`` against the table's fastest fixed
ortft route, alternating, for as many rounds as tell a 10% difference at the spread the table
measured (``peers_table.rounds_needed``); it gives the ratio's 95% interval and a verdict. It
runs under the interpreter ``--profiles`` names for ``--profile`` (the table's profile), as the
table's rows did.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import peer_common as common  # benchmarks/: the script's folder is on sys.path
import peers_table as table

# the peer benches, each a module with task_peers(): a new task's peer is one more name here
PEERS = (
    "peer",
    "peer_image",
    "peer_speech",
    "peer_sentence",
    "peer_dpo",
    "peer_diffusion",
    "peer_vlm",
)
NEEDS_ORT = ("ort", "ort-unpad")  # ortft routes a profile without ORT training cannot run
QUICK = {"rounds": 1, "steps": 3, "warmup": 2, "retries": 0}


def task_peers(names: list[str] | None) -> list[common.TaskPeer]:
    """Every bench's tasks, or those named, in the order named (an unknown name is an error
    naming it)."""
    found = [t for module in PEERS for t in importlib.import_module(module).task_peers()]
    known = [t.task for t in found]
    unknown = sorted(set(names or []) - set(known))
    if unknown:
        raise SystemExit(
            f"peers: --tasks: unknown {', '.join(unknown)} (known: {', '.join(known)})"
        )
    if names is None:
        return found
    return sorted((t for t in found if t.task in names), key=lambda t: names.index(t.task))


def has_ort_training() -> bool:
    try:
        return importlib.util.find_spec("onnxruntime.training") is not None
    except ModuleNotFoundError:
        return False


def machine_state() -> dict[str, float]:
    """The 1-minute load average and others' share of the CPU over one second (nothing of this
    bench runs while it is taken)."""
    busy0 = common.cpu_busy_s()
    time.sleep(1.0)
    share = (common.cpu_busy_s() - busy0) / (os.cpu_count() or 1)
    return {"load_avg": os.getloadavg()[0], "others_busy": share}


def alternate(peers: list[str], ortft: list[str]) -> list[str]:
    """peer, ortft, peer, ortft ... then whichever list is longer."""
    out = []
    for i in range(max(len(peers), len(ortft))):
        out += peers[i : i + 1] + ortft[i : i + 1]
    return out


def run_task(
    peer: common.TaskPeer, runners: list[str], a: argparse.Namespace, limits: table.Limits
) -> list[dict]:
    """``a.rounds`` kept rounds of ``runners`` (up to ``a.retries`` more while some were
    refused); every round as ``peers_table.round_record`` keeps it."""
    rounds: list[dict] = []
    with tempfile.TemporaryDirectory(prefix=f"ortft-peers-{peer.task}-") as tmp:
        while sum(r["kept"] for r in rounds) < a.rounds and len(rounds) < a.rounds + a.retries:
            if not a.allow_busy:
                common.wait_quiet(a.max_busy, a.wait)
            before = machine_state()
            order = runners if len(rounds) % 2 == 0 else runners[::-1]
            runs = {}
            for name in order:
                res = peer.measure(name, a.steps, a.warmup, Path(tmp), a.timeout)
                runs[name] = res
                what = (
                    f"{res['samples_per_s']:.1f} samples/s, {res['peak_rss_mb']:.0f} MB, others "
                    f"{res['others_share']:.0%}"
                    if res["ok"]
                    else res["error"]
                )
                print(
                    f"peers: {peer.task} round {len(rounds) + 1} {name:16s} {what}",
                    file=sys.stderr,
                    flush=True,
                )
            rounds.append(table.round_record(before, machine_state(), runs, limits))
            print(
                f"peers: {peer.task} round {len(rounds)}: {rounds[-1]['status']} "
                f"{'; '.join(rounds[-1]['reasons'])}",
                file=sys.stderr,
                flush=True,
            )
    return rounds


def task_limit(rounds: list[dict]) -> dict[str, Any] | None:
    """The measured matmul rate, fp32 and bf16, at the GEMMs of the task's mean micro-batch,
    where its runs counted FLOPs (None elsewhere)."""
    shape = next(
        (r["flops"] for one in rounds for r in one["runs"].values() if r["ok"] and r.get("flops")),
        None,
    )
    if shape is None:
        return None
    import torch

    from ortft.tools import limit

    gemms = limit.layer_gemms(shape["hidden"], shape["intermediate"], shape["tokens_per_micro"])
    # measured again, keeping the better rate: a cached rate may be a busy machine's (a loaded
    # smoke run's cache gave text-long 57 GFLOP/s fp32, the quiet machine 191)
    m = limit.measure(gemms, "cpu", torch.get_num_threads(), ("fp32", "bf16"), refresh=True)
    return {
        **{d: v["flops"] for d, v in m["dtypes"].items()},
        "shape": shape,
        "how": m["how"],
        "square": {d: v["square_flops"] for d, v in m["dtypes"].items()},
    }


def profile_part(a: argparse.Namespace, limits: table.Limits) -> None:
    """This interpreter's part of the table: every task's rounds, skips and limit, written to
    ``a.part`` after each task (a profile stopped midway keeps the tasks it finished)."""
    import torch
    import transformers

    ort = has_ort_training()
    versions = {"torch": torch.__version__, "transformers": transformers.__version__}
    if ort:
        import onnxruntime

        versions["onnxruntime"] = onnxruntime.__version__
    tasks: dict[str, Any] = {}
    part = {"python": sys.executable, "versions": versions, "tasks": tasks, "machine": common.cpu()}
    for peer in task_peers(a.tasks):
        ortft = [n for n in peer.ortft if ort or n not in NEEDS_ORT]
        skipped = {n: "no ORT training in this profile" for n in peer.ortft if n not in ortft}
        peers = list(peer.peers)
        if a.runners is not None:  # a targeted comparison: only the rows named
            peers = [n for n in peers if n in a.runners]
            ortft = [n for n in ortft if n in a.runners]
        rounds = run_task(peer, alternate(peers, ortft), a, limits)
        tasks[peer.task] = {
            "model": peer.model,
            "batch": peer.batch,
            "peers": peers,
            "ortft": ortft,
            "skipped": skipped,
            "rounds": rounds,
            "limit": task_limit(rounds),
        }
        common.write_json(a.part, part)


def run_profiles(a: argparse.Namespace, argv: list[str]) -> dict[str, dict[str, Any]]:
    """Each profile's part, from its own interpreter (a missing one is recorded as skipped)."""
    parts: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="ortft-peers-") as tmp:
        for name, python in a.profiles.items():
            if not Path(python).exists():
                parts[name] = {"skipped": f"{python} does not exist"}
                continue
            part = Path(tmp) / f"{name}.json"
            cmd = [python, __file__, *argv, "--profile-run", name, "--part", str(part)]
            print(f"peers: profile {name}: {python}", file=sys.stderr, flush=True)
            proc = subprocess.run(cmd, check=False, env={**os.environ, **common.OFFLINE})
            if not part.exists():
                parts[name] = {"skipped": f"its process failed (exit {proc.returncode})"}
                continue
            parts[name] = json.loads(part.read_text())
            if proc.returncode != 0:  # the tasks it finished stand; the note says it stopped
                parts[name]["stopped"] = f"its process stopped (exit {proc.returncode})"
    return parts


def assemble(parts: dict[str, dict[str, Any]], a: argparse.Namespace) -> dict[str, Any]:
    """The one table's JSON: the profiles' parts with each task's summary, the hour's plan."""
    ran = [p for p in parts.values() if "tasks" in p]
    machine = ran[0]["machine"] if ran else common.cpu()
    summaries = {}
    for profile, p in parts.items():
        for task, t in p.get("tasks", {}).items():
            t["summary"] = table.summarize_task(t)
            summaries[f"{profile}/{task}"] = t["summary"]
    return {
        "format_version": 1,
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": machine,
        "cpu_class": table.cpu_class(machine.get("bf16_flags") or []),
        "rounds": a.rounds,
        "steps": a.steps,
        "warmup": a.warmup,
        "quick": a.quick,
        "allow_busy": a.allow_busy,
        "limits": {"max_busy": a.max_busy, "max_load": a.max_load, "others": common.OTHERS},
        "profiles": parts,
        "hour": table.hour_plan(summaries) if summaries else None,
    }


def auto_vs_fixed(a: argparse.Namespace, limits: table.Limits) -> dict[str, Any]:
    """The targeted bench: per task, auto against the table's fastest fixed route, for the
    rounds its measured spread needs to tell a 10% difference (``a.rounds`` where the table had
    too few rounds for a spread; at most ``a.max_rounds``)."""
    saved = json.loads(a.table.read_text())
    part = saved["profiles"].get(a.profile) or {}
    out: dict[str, Any] = {}
    for peer in task_peers(a.tasks or list(part.get("tasks", {}))):
        summary = part.get("tasks", {}).get(peer.task, {}).get("summary") or {}
        fixed = summary.get("fastest_fixed")
        if fixed is None or "auto" not in peer.ortft:
            out[peer.task] = {"skipped": f"no fastest fixed route in {a.table} ({a.profile})"}
            continue
        spread = summary["log_spread"]["auto_vs_fastest_fixed"]
        planned = min(table.rounds_needed(spread) or a.rounds, a.max_rounds)
        rounds = run_task(
            peer, ["auto", fixed], argparse.Namespace(**{**vars(a), "rounds": planned}), limits
        )
        kept = [one for one in rounds if one["kept"]]
        ratios = table.round_ratios(kept, "auto", fixed)
        out[peer.task] = {
            "fixed": fixed,
            "table_log_spread": spread,
            "planned_rounds": planned,
            **table.auto_verdict(ratios),
            "rounds": rounds,
        }
    import torch

    return {
        "format_version": 1,
        "table": str(a.table),
        "profile": a.profile,
        "python": sys.executable,
        "torch": torch.__version__,
        "machine": common.cpu(),
        "allow_busy": a.allow_busy,
        "tasks": out,
    }


def profile_python(a: argparse.Namespace, p: argparse.ArgumentParser) -> str:
    """The interpreter of ``--profile`` (``--auto-vs-fixed``), from ``--profiles``: its runs
    are ortft and the peers under that profile's torch, as the table's were."""
    python = a.profiles.get(a.profile)
    if python is None:
        p.error(f"--profile {a.profile}: not in --profiles ({', '.join(a.profiles)})")
    if not Path(python).exists():
        p.error(f"--profiles: {python} does not exist")
    return os.path.abspath(python)


def merge(paths: list[Path], a: argparse.Namespace) -> dict[str, Any]:
    """Tables run apart (a profile each, some tasks each, or one run again) as one: each
    profile's tasks from the last table that ran them, a skipped profile only where no table
    ran it; the settings of the first."""
    tables = [json.loads(p.read_text()) for p in paths]
    parts: dict[str, dict[str, Any]] = {}
    for saved in tables:
        for name, part in saved["profiles"].items():
            earlier = parts.get(name, {}).get("tasks")
            if "tasks" in part and earlier is not None:  # the same profile, other tasks
                parts[name] = {**part, "tasks": {**earlier, **part["tasks"]}}
            elif "tasks" in part or name not in parts:
                parts[name] = part
    first = tables[0]
    keys = ("rounds", "steps", "warmup", "quick", "allow_busy")
    settings = argparse.Namespace(
        **{**vars(a), **{k: first[k] for k in keys}, **first["limits"]},
    )
    settings.allow_busy = any(t["allow_busy"] for t in tables)
    return assemble(parts, settings)


def options() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument(
        "--tasks",
        type=lambda s: [x for x in s.split(",") if x],
        default=None,
        help="comma-separated tasks (default: every peer bench's)",
    )
    p.add_argument("--rounds", type=int, default=3, help="kept rounds per task")
    p.add_argument("--steps", type=int, default=20, help="timed steps per measurement")
    p.add_argument("--warmup", type=int, default=4, help="untimed steps before them")
    p.add_argument(
        "--runners",
        type=lambda s: [x for x in s.split(",") if x],
        default=None,
        help="only these rows, peer settings and ortft routes (e.g. torch-bf16,torch-bf16w): "
        "a targeted comparison; the default runs every row",
    )
    p.add_argument("--quick", action="store_true", help="a smoke run: 1 round, 3 steps, 2 warm-up")
    common.add_quiet_options(p)
    p.add_argument(
        "--max-load",
        type=float,
        default=(os.cpu_count() or 1) + 1.0,
        help="refuse a round when the 1-minute load average before or after it is "
        "above this (default: cores + 1)",
    )
    p.add_argument(
        "--allow-busy",
        action="store_true",
        help="keep rounds taken on a busy machine (marked) instead of refusing them",
    )
    p.add_argument(
        "--profiles",
        default=f"this={sys.executable}",
        help="NAME=PYTHON,... : the interpreters to run the tasks with",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=common.REPO / "benchmarks" / "results" / "peers",
        help="the results' path without its suffix: .md and .json are written",
    )
    p.add_argument("--auto-vs-fixed", action="store_true", help="the targeted bench (see above)")
    p.add_argument(
        "--table", type=Path, default=common.REPO / "benchmarks" / "results" / "peers.json"
    )
    p.add_argument("--profile", default="this", help="--auto-vs-fixed: the table's profile")
    p.add_argument("--max-rounds", type=int, default=30, help="--auto-vs-fixed: at most")
    p.add_argument(
        "--merge", type=Path, nargs="+", help="tables (.json) run apart to write as one, no runs"
    )
    p.add_argument("--profile-run", help=argparse.SUPPRESS)  # a profile's own process
    p.add_argument("--part", type=Path, help=argparse.SUPPRESS)
    return p


def main() -> None:
    p = options()
    a = p.parse_args()
    if a.quick:
        vars(a).update(QUICK)
    if a.rounds < 1 or a.steps < 1 or a.warmup < 1 or a.retries < 0:
        p.error("--rounds, --steps and --warmup must be >= 1, --retries >= 0")
    try:
        a.profiles = dict(x.split("=", 1) for x in a.profiles.split(","))
    except ValueError:
        p.error(f"--profiles: NAME=PYTHON,... not {a.profiles!r}")
    if a.runners is not None:
        known = {n for t in task_peers(a.tasks) for n in (*t.peers, *t.ortft)}
        unknown = [n for n in a.runners if n not in known]
        if unknown or not a.runners:
            p.error(
                f"--runners: {', '.join(unknown) or 'none named'} (known: {', '.join(sorted(known))})"
            )
    limits = table.Limits(a.max_busy, a.max_load, common.OTHERS, a.allow_busy)
    os.environ.update(common.OFFLINE)
    if a.profile_run:
        profile_part(a, limits)
        return
    a.out.parent.mkdir(parents=True, exist_ok=True)
    if a.merge:
        result = merge(a.merge, a)
        text = table.markdown(result)
    elif a.auto_vs_fixed:
        python = profile_python(a, p)
        if python != os.path.abspath(sys.executable):  # the profile's torch runs the bench
            # os.environ carries OFFLINE already (above)
            sys.exit(subprocess.run([python, __file__, *sys.argv[1:]], check=False).returncode)
        result = auto_vs_fixed(a, limits)
        text = table.auto_markdown(result)
    else:
        result = assemble(run_profiles(a, sys.argv[1:]), a)
        text = table.markdown(result)
    common.write_json(a.out.with_suffix(".json"), result)
    a.out.with_suffix(".md").write_text(text)
    print(text)
    print(f"peers: wrote {a.out}.md and .json", file=sys.stderr)


if __name__ == "__main__":
    main()
