"""Reports for CI systems: JUnit XML (each gate a test case) and a Markdown job summary.

`--report FILE` picks the format from the suffix: `.xml` → JUnit, `.md` → Markdown.
Both are written for failed and interrupted runs too, so the CI page always says why.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ortft.core import fsutil
from ortft.core.errors import UsageError
from ortft.run.summary import BackendReport, RunSummary

Summary = RunSummary | Mapping[str, Any]  # a dict: summary.json as read from disk

FORMATS = {".xml": "junit", ".md": "markdown"}


def check_paths(paths: list[Path]) -> None:
    """Refuse unknown report formats before anything runs."""
    for p in paths:
        if p.suffix.lower() not in FORMATS:
            raise UsageError(f"--report {p}: use a .xml (JUnit) or .md (Markdown) file name")


def junit(summary: Summary, name: str = "ortft") -> str:
    s = RunSummary.coerce(summary)
    gates, status = s.gates, s.status or "unknown"
    suite = ET.Element("testsuite", name=name)
    failures = errors = 0
    run_case = ET.SubElement(
        suite,
        "testcase",
        classname=f"{name}.run",
        name="training run",
        time=f"{s.wall_time_s or 0:.3f}",
    )
    if status not in ("completed", "stopped"):
        errors += 1
        err = ET.SubElement(run_case, "error", message=str(s.error or status), type=status)
        err.text = str(s.error or "")
    for g in gates:
        case = ET.SubElement(suite, "testcase", classname=f"{name}.gates", name=g["gate"], time="0")
        shown = "missing" if g["value"] is None else f"{g['value']:.6g}"
        if not g["passed"]:
            failures += 1
            fail = ET.SubElement(
                case,
                "failure",
                type="gate",
                message=f"{g['metric']} = {shown}, needs {g['op']} {g['threshold']:g}",
            )
            fail.text = g.get("reason") or ""
        else:
            ET.SubElement(case, "system-out").text = f"{g['metric']} = {shown}"
    suite.set("tests", str(1 + len(gates)))
    suite.set("failures", str(failures))
    suite.set("errors", str(errors))
    suite.set("time", f"{s.wall_time_s or 0:.3f}")
    root = ET.Element("testsuites")
    root.append(suite)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "—" if value is None else str(value)


def _ort_cpu(packages: dict) -> str:
    """The CPU build's version (Python 3.12's lock), labelled, when the CUDA build is absent."""
    version = packages.get("onnxruntime-training-cpu")
    return f"{version} (-cpu)" if version else "—"


def markdown(summary: Summary) -> str:
    s = RunSummary.coerce(summary)
    b = s.backend or BackendReport(requested="—", used="—")
    t, prov, pk = s.throughput, s.provenance, s.provenance.packages
    lines = [f"## ortft run: {s.status or 'unknown'}", ""]
    if s.error:
        lines += [f"**Error:** {s.error}", ""]
    gates = s.gates
    if gates:
        lines += ["| gate | value | result |", "|---|---|---|"]
        for g in gates:
            lines.append(
                f"| `{g['gate']}` | {_fmt(g['value'])} | "
                f"{'✅ pass' if g['passed'] else '❌ fail'} |"
            )
        lines.append("")
    lines += ["| metric | value |", "|---|---|"]
    for k, v in s.metrics.items():
        lines.append(f"| {k} | {_fmt(v)} |")
    lines += [
        "",
        f"- **Backend:** {b.used or '—'} (requested {b.requested or '—'}; "
        f"fallback {'yes' if b.fallback else 'no'}; ORT exports {b.ort_exports})",
        f"- **Steps:** {s.steps}; wall time {_fmt(s.wall_time_s)} s",
        f"- **Throughput:** {_fmt(t.get('samples_per_s'))} samples/s, "
        f"{_fmt(t.get('tokens_per_s'))} tokens/s",
        f"- **Versions:** ortft {pk.get('ortft', '—')}, torch {pk.get('torch', '—')}, "
        f"onnxruntime-training {pk.get('onnxruntime-training') or _ort_cpu(pk)}, "
        f"transformers {pk.get('transformers', '—')}",
        f"- **Recipe sha256:** `{prov.recipe_sha256 or '—'}`; git commit "
        f"`{prov.git_commit or '—'}`{' (uncommitted changes)' if prov.git_dirty else ''}",
        "",
    ]
    return "\n".join(lines)


def write(paths: list[Path], summary: Summary) -> None:
    summary = RunSummary.coerce(summary)
    for p in paths:
        text = junit(summary) if FORMATS[p.suffix.lower()] == "junit" else markdown(summary)
        p.parent.mkdir(parents=True, exist_ok=True)
        fsutil.write_text_atomic(p, text)
