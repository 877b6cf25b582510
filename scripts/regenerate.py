"""What the data scripts in scripts/ share: write a committed data folder, or (``--check``)
regenerate it in a temporary folder and compare it byte for byte with the committed one.

    from regenerate import main   # scripts/ is sys.path[0] when a script runs
    main("make-digits", write_all, OUT, __doc__)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path


def first_difference(expected: Path, actual: Path) -> str | None:
    """The first file that is missing, extra or different in ``actual`` (None: the same)."""
    want = {p.relative_to(expected) for p in expected.rglob("*") if p.is_file()}
    have = {p.relative_to(actual) for p in actual.rglob("*") if p.is_file()}
    if want - have:
        return f"{actual / sorted(want - have)[0]} is missing"
    if have - want:
        return f"{actual / sorted(have - want)[0]} is not made by this script"
    for rel in sorted(want):
        if (expected / rel).read_bytes() != (actual / rel).read_bytes():
            return f"{actual / rel} differs from a fresh run"
    return None


def main(name: str, write_all: Callable[[Path], None], out: Path, doc: str | None) -> None:
    """``python scripts/NAME.py``: write ``out``; with ``--check``: exit 1 unless it matches a
    fresh run."""
    parser = argparse.ArgumentParser(description=(doc or name).splitlines()[0])
    parser.add_argument("--check", action="store_true", help=f"compare a fresh run with {out}")
    args = parser.parse_args()
    if not args.check:
        write_all(out)
        print(out)
        return
    with tempfile.TemporaryDirectory() as tmp:
        write_all(Path(tmp))
        problem = first_difference(Path(tmp), out)
    if problem:
        print(f"{name} --check: {problem}; rerun: python scripts/{name}.py", file=sys.stderr)
        sys.exit(1)
    print(f"{name} --check: {out} matches a fresh run")
