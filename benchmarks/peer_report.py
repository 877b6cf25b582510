"""benchmarks/peer.py's summary: per data kind and route the medians over the rounds and the
ratios to the fp32 Trainer and to the best Trainer (round by round), issue 29's checks with
their figures, and the markdown table on stdout."""

from __future__ import annotations

import statistics
from collections import Counter
from typing import Any

# what a route's table row keeps: the median over the rounds
SUMMARIZED = ("samples_per_s", "ms_per_step", "loss_step1", "loss_mean", "eval_loss",
              "eval_accuracy", "mean_batch_length", "padding_fraction", "wall_s")  # fmt: skip


def _ratios(runs: list[dict], bases: list[dict] | None) -> dict[str, Any] | None:
    """samples/s over the base's, round by round where both ran: median and min-max."""
    if bases is None:
        return None
    pairs = [r["samples_per_s"] / b["samples_per_s"] for r, b in zip(runs, bases, strict=True)
             if r["ok"] and b["ok"]]  # fmt: skip
    if not pairs:
        return None
    return {"median": statistics.median(pairs), "range": [min(pairs), max(pairs)]}


def _median_of(runs: list[dict], key: str) -> float | None:
    values = [r[key] for r in runs if r["ok"] and r.get(key) is not None]
    return statistics.median(values) if values else None


def summarize(kind_rounds: list[dict[str, dict]], trainers: list[str]) -> dict[str, Any]:
    """One kind: per route the medians and ratios; the best Trainer (the fastest of ``trainers``
    that ran); the fastest fixed ortft route (not auto)."""
    runs = {name: [one[name] for one in kind_rounds] for name in kind_rounds[0]}
    rows: dict[str, dict[str, Any]] = {}
    for name, rs in runs.items():
        row = {key: _median_of(rs, key) for key in SUMMARIZED}
        shares = [r["others_share"] for r in rs]
        ran_as = Counter(r["ran_as"] for r in rs if r["ok"]).most_common(1)
        row.update(
            ran_as=ran_as[0][0] if ran_as else None,
            runs_ok=sum(r["ok"] for r in rs),
            errors=sorted({r["error"] for r in rs if not r["ok"]}),
            others_share_max=max(shares) if shares else None,
        )
        rows[name] = row

    def fastest(names: list[str]) -> str | None:
        ran = [n for n in names if rows[n]["samples_per_s"] is not None]
        return max(ran, key=lambda n: rows[n]["samples_per_s"]) if ran else None

    best = fastest([n for n in runs if n in trainers])
    fixed = fastest([n for n in runs if n not in trainers and n != "auto"])
    for name, row in rows.items():
        row["vs_trainer"] = _ratios(runs[name], runs.get("trainer"))
        row["vs_best_trainer"] = _ratios(runs[name], runs[best] if best else None)
    auto_vs_fixed = _ratios(runs["auto"], runs[fixed]) if "auto" in runs and fixed else None
    return {"best_trainer": best, "fastest_fixed": fixed, "auto_vs_fastest_fixed": auto_vs_fixed,
            "routes": rows}  # fmt: skip


def checks(kinds: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue 29's targets, each with its figure (None where a route it needs did not run)."""
    out = []
    for kind, s in kinds.items():
        rows = s["routes"]
        auto, ort = rows.get("auto", {}), rows.get("ort", {})
        floor = {"short": 1.5, "long": 1.3}[kind]
        best, fixed = s["best_trainer"] or "none ran", s["fastest_fixed"] or "none ran"
        out += [
            (kind, f"auto >= {floor}x the best Trainer ({best})", auto.get("vs_best_trainer"),
             floor),
            (kind, f"auto within 10% of the fastest fixed route ({fixed})",
             s["auto_vs_fastest_fixed"], 0.9),
            (kind, "ort fp32 >= 1.5x the fp32 Trainer", ort.get("vs_trainer"), 1.5),
        ]  # fmt: skip
    return [
        {"kind": kind, "check": what, "floor": floor, "figure": fig,
         "passed": fig is not None and fig["median"] >= floor}
        for kind, what, fig, floor in out
    ]  # fmt: skip


def ratio_cell(ratio: dict[str, Any] | None) -> str:
    if ratio is None:
        return "—"
    lo, hi = ratio["range"]
    return f"{ratio['median']:.2f}× ({lo:.2f}–{hi:.2f})"


def number_cell(value: float | None, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def print_table(result: dict[str, Any]) -> None:
    print(
        f"peer: {result['rounds_clean']} clean of {result['rounds_run']} round(s) × "
        f"{result['steps']} timed steps after {result['warmup']} warm-up, batch "
        f"{result['batch']}, max_length {result['max_length']}, all-MiniLM-L6-v2; the table: "
        f"{result['rounds_summarized']} rounds\n"
    )
    print("| data | route | ran as | ms/step | samples/s | vs Trainer fp32 | vs best Trainer "
          "| step-1 loss | mean loss | eval loss | eval acc | others max |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for kind, s in result["kinds"].items():
        for name, r in s["routes"].items():
            tag = " (best Trainer)" if name == s["best_trainer"] else ""
            ran = r["ran_as"] or "failed"
            print(
                f"| {kind} | {name}{tag} | {ran} | {number_cell(r['ms_per_step'], '.0f')} | "
                f"{number_cell(r['samples_per_s'], '.1f')} | {ratio_cell(r['vs_trainer'])} | "
                f"{ratio_cell(r['vs_best_trainer'])} | {number_cell(r['loss_step1'], '.4f')} | "
                f"{number_cell(r['loss_mean'], '.4f')} | {number_cell(r['eval_loss'], '.4f')} | "
                f"{number_cell(r['eval_accuracy'], '.3f')} | {number_cell(r['others_share_max'], '.0%')} |"
            )
        for name in result["skipped"]:
            print(f"| {kind} | {name} | skipped | | | | | | | | | |")
    print()
    for kind, s in result["kinds"].items():
        for name, r in s["routes"].items():
            for error in r["errors"]:
                print(f"peer: {kind} {name} failed: {error}")
    for name, why in result["skipped"].items():
        print(f"peer: {name} skipped: {why}")
    for line in probe_lines(result):
        print(line)
    for c in result["checks"]:
        verdict = "PASS" if c["passed"] else "FAIL"
        figure = (
            ratio_cell(c["figure"]) if c["figure"] else "no figure (a route it needs did not run)"
        )
        print(f"check: {c['kind']:5s} {c['check']}: {verdict} {figure}")


def probe_lines(result: dict[str, Any]) -> list[str]:
    """auto's probe in the last round that ran it, per kind: each candidate's figures."""
    out = []
    for kind in result["kinds"]:
        runs = [one[kind]["auto"] for one in result.get("runs", []) if "auto" in one[kind]]
        probe = next((r.get("probe") for r in reversed(runs) if r["ok"] and r.get("probe")), None)
        if not probe:
            continue
        parts = []
        for label, b in (probe.get("backends") or {}).items():
            if "median_step_s" in b:
                est = b.get("estimated_total_s")
                run = f" (run ~{est:.0f} s)" if est is not None else ""
                ms = 1000 * b["median_step_s"]
                parts.append(f"{label} {b.get('dtype', '')} {ms:.0f} ms/step{run}")
            else:
                parts.append(f"{label}: {b.get('skipped') or b.get('error') or 'no figure'}")
        chosen = probe.get("route") or probe.get("chosen")
        out.append(f"peer: {kind} auto's probe chose {chosen}: " + "; ".join(parts))
    return out
