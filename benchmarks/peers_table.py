"""The one peer table's arithmetic (benchmarks/peers.py runs the rounds): which rounds count (a
busy machine's are refused), per task and route the median samples/s, its spread over the rounds,
peak memory, the ratio to the best peer setting, the share of the measured matmul limit; how many
rounds fit an hour and how many tell a 10% difference; and the Markdown. Nothing runs here: the
inputs are the rounds' JSON, so a test builds them by hand.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

from peer_report import number_cell, ratio_cell  # peer.py's table's cells

# two-sided 95% quantiles of Student's t by degrees of freedom (1-30); 1.96 beyond
T95 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,  # df 1-10
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,  # df 11-20
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,  # df 21-30
)  # fmt: skip
Z_POWER = 0.8416  # one-sided normal quantile for 80% power
DIFFERENCE = 0.10  # the difference the targeted bench must tell apart (auto vs the fastest fixed)
HOUR_S = 3600.0


@dataclass(frozen=True)
class Limits:
    """When a round counts as taken on a busy machine (any one of these refuses it)."""

    max_busy: float  # others' share of the CPU over a second, just before and just after it
    max_load: float  # the 1-minute load average then (it still holds this bench's last run)
    others: float  # others' share of the CPU during any of its runs (peer_common.OTHERS)
    allow_busy: bool = False  # keep a busy round anyway, marked (a loaded dev machine)


def verdict(before: dict, after: dict, runs: dict[str, dict], limits: Limits) -> list[str]:
    """Why a round was taken on a busy machine (empty: it was not)."""
    reasons = []
    for when, state in (("before", before), ("after", after)):
        if state["others_busy"] > limits.max_busy:
            reasons.append(
                f"others took {state['others_busy']:.0%} of the CPU {when} the round "
                f"(max {limits.max_busy:.0%})"
            )
        if state["load_avg"] > limits.max_load:
            reasons.append(
                f"load average {state['load_avg']:.1f} {when} the round (max {limits.max_load:.1f})"
            )
    busy = [n for n, r in runs.items() if r["ok"] and r["others_share"] > limits.others]
    if busy:
        reasons.append(f"others took over {limits.others:.0%} of the CPU during {', '.join(busy)}")
    return reasons


def round_record(before: dict, after: dict, runs: dict[str, dict], limits: Limits) -> dict:
    """A round as the JSON keeps it: refused when busy, kept and marked with ``allow_busy``."""
    reasons = verdict(before, after, runs, limits)
    if not reasons:
        status = "clean"
    else:
        status = "busy, kept (--allow-busy)" if limits.allow_busy else "refused: busy"
    return {
        "status": status,
        "kept": not reasons or limits.allow_busy,
        "reasons": reasons,
        "before": before,
        "after": after,
        "runs": runs,
    }


def dtype_of(res: dict[str, Any]) -> str:
    """The precision a run's matmuls ran in: a Trainer's ``bf16``, ortft's summary's dtype."""
    return "bf16" if res.get("bf16") or res.get("precision") == "bf16" else "fp32"


def ran_as(res: dict[str, Any], dtype: str) -> str:
    """What a run ran as: its bench's own words, else ortft's backend and dtype, else the dtype."""
    if res.get("ran_as"):
        return str(res["ran_as"])
    if not res.get("backend_used"):
        return dtype
    weights = " (bf16 weights)" if res.get("weights") == "bf16" else ""
    return f"{res['backend_used']} {dtype}{weights}"


def _ratios(rounds: list[dict], name: str, base: str | None) -> list[float]:
    """``name``'s samples/s over ``base``'s, round by round where both ran."""
    if base is None:
        return []
    out = []
    for one in rounds:
        r, b = one["runs"].get(name), one["runs"].get(base)
        if r and b and r["ok"] and b["ok"]:
            out.append(r["samples_per_s"] / b["samples_per_s"])
    return out


def _ratio(values: list[float]) -> dict[str, Any] | None:
    if not values:
        return None
    return {"median": statistics.median(values), "range": [min(values), max(values)]}


def log_spread(values: list[float]) -> float | None:
    """The standard deviation of the ratios' logarithms (None under two rounds)."""
    return statistics.stdev(math.log(v) for v in values) if len(values) >= 2 else None


def rounds_needed(spread: float | None, difference: float = DIFFERENCE) -> int | None:
    """Paired rounds for a two-sided 5% test with 80% power to tell a ``difference`` (10%: a
    ratio of 1.1) from none, given the log ratios' spread; at least 3."""
    if spread is None:
        return None
    n = ((1.96 + Z_POWER) * spread / math.log(1 + difference)) ** 2
    return max(3, math.ceil(n))


def half_width(spread: float | None, rounds: int) -> float | None:
    """The 95% interval's half-width of a mean log ratio over ``rounds`` rounds, as a factor
    (0.05: the ratio is known to ±5%)."""
    if spread is None or rounds < 2:
        return None
    t = T95[rounds - 2] if rounds - 1 <= len(T95) else 1.96
    return math.exp(t * spread / math.sqrt(rounds)) - 1


def _row(runs: list[dict], flops_per_sample: float | None, limit: dict | None) -> dict:
    ok = [r for r in runs if r["ok"]]
    sps = [r["samples_per_s"] for r in ok]
    row: dict[str, Any] = {
        "runs": len(runs),
        "runs_ok": len(ok),
        "errors": sorted({r["error"] for r in runs if not r["ok"]}),
    }
    if not ok:
        return row
    median = statistics.median(sps)
    dtype = dtype_of(ok[-1])
    rss = [r["peak_rss_mb"] for r in ok if r.get("peak_rss_mb") is not None]
    row.update(
        samples_per_s=median,
        samples_per_s_range=[min(sps), max(sps)],
        spread=(max(sps) - min(sps)) / median,
        ms_per_step=statistics.median(r["ms_per_step"] for r in ok),
        peak_rss_mb=max(rss) if rss else None,
        dtype=dtype,
        ran_as=ran_as(ok[-1], dtype),
    )
    rate = (limit or {}).get(dtype)
    if flops_per_sample and rate:
        row["flops_per_s"] = median * flops_per_sample
        row["limit_share"] = row["flops_per_s"] / rate
    return row


def _fastest(rows: dict[str, dict], names: list[str]) -> str | None:
    ran = [n for n in names if rows[n].get("samples_per_s") is not None]
    return max(ran, key=lambda n: rows[n]["samples_per_s"]) if ran else None


def summarize_task(task: dict[str, Any]) -> dict[str, Any]:
    """One task of one profile: per route its row, the best peer setting, the fastest fixed
    ortft route, auto against both, and the spreads behind the round counts."""
    kept = [one for one in task["rounds"] if one["kept"]]
    names = [*task["peers"], *task["ortft"]]
    per_sample = [
        r["flops"]["per_sample"]
        for one in kept
        for r in one["runs"].values()
        if r["ok"] and r.get("flops")
    ]
    fps = statistics.median(per_sample) if per_sample else None
    rows = {
        n: _row([one["runs"][n] for one in kept if n in one["runs"]], fps, task.get("limit"))
        for n in names
    }
    best = _fastest(rows, list(task["peers"]))
    fixed = _fastest(rows, [n for n in task["ortft"] if n != "auto"])
    for n, row in rows.items():
        row["vs_best_peer"] = _ratio(_ratios(kept, n, best))
    auto_best, auto_fixed = _ratios(kept, "auto", best), _ratios(kept, "auto", fixed)
    walls = [sum(r.get("wall_s", 0.0) for r in one["runs"].values()) for one in task["rounds"]]
    return {
        "rounds_run": len(task["rounds"]),
        "rounds_kept": len(kept),
        "best_peer": best,
        "fastest_fixed": fixed,
        "auto_vs_best_peer": _ratio(auto_best),
        "auto_vs_fastest_fixed": _ratio(auto_fixed),
        "log_spread": {
            "auto_vs_best_peer": log_spread(auto_best),
            "auto_vs_fastest_fixed": log_spread(auto_fixed),
        },
        "flops_per_sample": fps,
        "round_s": statistics.median(walls) if walls else None,
        "routes": rows,
    }


def hour_plan(summaries: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """How many rounds of every task fit in an hour (their measured round times summed) and the
    95% interval that leaves on auto / the best peer, per task, from its measured spread."""
    total = sum(s["round_s"] or 0.0 for s in summaries.values())
    rounds = int(HOUR_S // total) if total else 0
    per_task = {}
    for task, s in summaries.items():
        spread = s["log_spread"]["auto_vs_best_peer"]
        per_task[task] = {
            "round_s": s["round_s"],
            "log_spread": spread,
            "half_width": half_width(spread, rounds),
        }
    return {"round_s_all_tasks": total, "rounds_in_hour": rounds, "tasks": per_task}


def cpu_class(flags: list[str]) -> str:
    """The CPU's class for the table: bf16-capable (which units) or not."""
    names = {"amx_bf16": "AMX", "avx512_bf16": "AVX-512 BF16"}
    if not flags:
        return "no bf16 matmul units (fp32 CPU: bf16 is emulated)"
    return "bf16-capable (" + " + ".join(names.get(f, f) for f in flags) + ")"


# --------------------------------------------------------------------------- the Markdown


def _route_line(profile: str, task: str, name: str, row: dict, s: dict) -> str:
    tag = " (best peer)" if name == s["best_peer"] else ""
    tag += " (fastest fixed)" if name == s["fastest_fixed"] else ""
    if row.get("samples_per_s") is None:
        return f"| {profile} | {task} | {name}{tag} | failed | | | | | | |"
    lo, hi = row["samples_per_s_range"]
    share = row.get("limit_share")
    limit = "—" if share is None else f"{row['flops_per_s'] / 1e9:.0f} GFLOP/s, {share:.0%}"
    return (
        f"| {profile} | {task} | {name}{tag} | {row['ran_as']} | {row['samples_per_s']:.1f} | "
        f"{lo:.1f}–{hi:.1f} (±{row['spread'] / 2:.0%}) | {ratio_cell(row['vs_best_peer'])} | "
        f"{number_cell(row['ms_per_step'], '.0f')} | {number_cell(row['peak_rss_mb'], '.0f')} | {limit} |"
    )


def _notes(profile: str, task: str, t: dict) -> list[str]:
    s = t["summary"]
    out = [
        f"- {profile} / {task} ({t['model']}, batch {t['batch']}): {s['rounds_kept']} of "
        f"{s['rounds_run']} round(s) kept; auto {ratio_cell(s['auto_vs_best_peer'])} the best peer "
        f"setting ({s['best_peer'] or 'none ran'}), {ratio_cell(s['auto_vs_fastest_fixed'])} the "
        f"fastest fixed route ({s['fastest_fixed'] or 'none ran'}); a round "
        f"{number_cell(s['round_s'], '.0f')} s"
    ]
    for i, one in enumerate(t["rounds"], 1):
        if one["reasons"]:
            out.append(f"  - round {i} {one['status']}: {'; '.join(one['reasons'])}")
    for name, why in t.get("skipped", {}).items():
        out.append(f"  - {name} skipped: {why}")
    for name, row in s["routes"].items():
        for error in row["errors"]:
            out.append(f"  - {name} failed: {error}")
    return out


def markdown(table: dict[str, Any]) -> str:
    """The one table: every profile's tasks and routes, then the notes and the hour's plan."""
    m = table["machine"]
    lines = [
        f"# ortft against each task's peer ({table['when']})",
        "",
        f"CPU: {m['cpu']}, {m['cores']} cores; class: {table['cpu_class']}.",
        f"Rounds: {table['rounds']} per task × {table['steps']} timed steps after "
        f"{table['warmup']} warm-up, every run a fresh process, peer and ortft alternating.",
    ]
    if table["allow_busy"]:
        lines.append(
            "**Machine loaded**: busy rounds were kept (`--allow-busy`); the figures say the "
            "bench runs, not how fast anything is."
        )
    lines += [
        "",
        "| profile | task | route | ran as | samples/s | over rounds | vs best peer | ms/step "
        "| peak MB | FLOP/s, share of limit |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    notes = []
    for profile, p in table["profiles"].items():
        if "skipped" in p:
            notes.append(f"- profile {profile} skipped: {p['skipped']}")
            continue
        if p.get("versions"):
            libs = ", ".join(f"{k} {v}" for k, v in p["versions"].items())
            notes.append(f"- profile {profile}: {libs}")
        if "stopped" in p:
            notes.append(f"- profile {profile}: {p['stopped']}; the tasks it finished are here")
        for task, t in p["tasks"].items():
            s = t["summary"]
            for name, row in s["routes"].items():
                lines.append(_route_line(profile, task, name, row, s))
            notes += _notes(profile, task, t)
            if t.get("limit"):
                lim = t["limit"]
                notes.append(
                    f"  - measured limit at its GEMMs: fp32 {lim['fp32'] / 1e9:.0f}, bf16 "
                    f"{lim['bf16'] / 1e9:.0f} GFLOP/s ({lim['how']})"
                )
    plan = table.get("hour")
    if plan:
        notes.append(
            f"- an hour: a round of every task takes {plan['round_s_all_tasks']:.0f} s, so "
            f"{plan['rounds_in_hour']} round(s) of each fit in 60 minutes; the 95% interval "
            "that leaves on auto / the best peer: "
            + ", ".join(
                f"{task} ±{number_cell(x['half_width'], '.0%')}"
                for task, x in plan["tasks"].items()
            )
        )
    return "\n".join([*lines, "", *notes, ""])


# --------------------------------------------------------------------------- auto vs fixed


def round_ratios(rounds: list[dict], name: str, base: str) -> list[float]:
    return _ratios(rounds, name, base)


def auto_verdict(ratios: list[float], difference: float = DIFFERENCE) -> dict[str, Any]:
    """auto / the fixed route over the kept rounds: the geometric mean, its 95% interval, and
    whether auto is within ``difference`` of it (the interval above 1 / (1 + difference)),
    behind by more, or not told apart in these rounds."""
    floor = 1 / (1 + difference)
    if not ratios:
        return {"ratio": None, "interval": None, "verdict": "no round with both routes kept"}
    logs = [math.log(r) for r in ratios]
    mean = statistics.fmean(logs)
    spread = log_spread(ratios)
    hw = half_width(spread, len(ratios))
    if hw is None:
        return {"ratio": math.exp(mean), "interval": None, "verdict": "one round: no interval"}
    lo, hi = math.exp(mean) / (1 + hw), math.exp(mean) * (1 + hw)
    if lo >= floor:
        verdict = f"auto within {difference:.0%} of the fixed route"
    elif hi < floor:
        verdict = f"auto more than {difference:.0%} slower than the fixed route"
    else:
        verdict = f"not told apart in {len(ratios)} rounds"
    return {
        "ratio": math.exp(mean),
        "interval": [lo, hi],
        "log_spread": spread,
        "rounds_used": len(ratios),
        "verdict": verdict,
    }


def auto_markdown(result: dict[str, Any]) -> str:
    lines = [
        f"# auto against the fastest fixed route ({result['profile']}; {result['table']})",
        "",
        f"CPU: {result['machine']['cpu']}; torch {result.get('torch', '?')} "
        f"({result.get('python', '?')})",
        "",
        "| task | fixed route | rounds planned / kept | auto / fixed | 95% interval | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for task, t in result["tasks"].items():
        if "skipped" in t:
            lines.append(f"| {task} | — | — | — | — | skipped: {t['skipped']} |")
            continue
        iv = t["interval"]
        lines.append(
            f"| {task} | {t['fixed']} | {t['planned_rounds']} / {t.get('rounds_used', 0)} | "
            f"{number_cell(t['ratio'], '.3f')} | {'—' if iv is None else f'{iv[0]:.3f}–{iv[1]:.3f}'} | "
            f"{t['verdict']} |"
        )
    return "\n".join([*lines, ""])
