"""``ortft cache``: list and prune what ortft keeps under ``ORTFT_CACHE`` for data.

Two kinds of entries: ``tokenized`` (``tokenized/<key>/``: a split's token arrays, one per
distinct tokenizer / task / data section / rows) and ``rows`` (``datasets/<builder>/<config>/``:
a source file's rows in Arrow, read by ``datasets``). Both are rebuilt on demand, so pruning
costs a re-read and a re-tokenize, never a result.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

from ortft.core.errors import UsageError
from ortft.data import rows as data
from ortft.data import tokenized


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def _tokenized_entries(now: float) -> list[dict[str, Any]]:
    out = []
    root = tokenized.root()
    for path in sorted(root.iterdir()) if root.is_dir() else []:
        if path.suffix == ".lock":
            continue
        meta_file = path / tokenized.META
        meta = json.loads(meta_file.read_text()) if meta_file.is_file() else {}
        created = meta.get("created", path.stat().st_mtime)
        kind = "tokenized" if meta else ("old-npz" if path.suffix == ".npz" else "incomplete")
        out.append(
            {
                "kind": kind,
                "path": str(path),
                "bytes": _size(path),
                "age_s": round(now - created, 1),
                "source": meta.get("source", ""),
                "task": meta.get("task", ""),
                "rows": meta.get("rows"),
            }
        )
    return out


def _rows_entries(now: float) -> list[dict[str, Any]]:
    root = data.cache_root() / "datasets"
    out = []
    for path in sorted(root.glob("*/*")) if root.is_dir() else []:
        if not path.is_dir() or path.parent.name.startswith("_") or path.name.endswith(".lock"):
            continue
        out.append(
            {
                "kind": "rows",
                "path": str(path),
                "bytes": _size(path),
                "age_s": round(now - path.stat().st_mtime, 1),
                "source": path.parent.name,  # the datasets builder: generator, parquet, ...
                "task": "",
                "rows": None,
            }
        )
    return out


def entries() -> list[dict[str, Any]]:
    """Every data cache entry, oldest first."""
    now = time.time()
    found = _tokenized_entries(now) + _rows_entries(now)
    return sorted(found, key=lambda e: -e["age_s"])


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"


def format_table(found: list[dict[str, Any]], verb: str = "") -> str:
    """One line per entry, then the count and total size (``verb``: e.g. "removed")."""
    lines = [f"{'kind':<10} {'size':>9} {'age':>6} {'rows':>9}  source  (path)"]
    for e in found:
        rows = "" if e["rows"] is None else str(e["rows"])
        src = e["source"] + (f" [{e['task']}]" if e["task"] else "")
        lines.append(
            f"{e['kind']:<10} {_human(e['bytes']):>9} {_age(e['age_s']):>6} {rows:>9}  "
            f"{src}  ({e['path']})"
        )
    total = sum(e["bytes"] for e in found)
    lines.append(
        f"{len(found)} entries, {_human(total)}{' ' + verb if verb else ''} in {data.cache_root()}"
    )
    return "\n".join(lines)


def parse_age(text: str) -> float:
    """'30d', '12h', '45m' or seconds -> seconds."""
    units = {"d": 86400, "h": 3600, "m": 60, "s": 1}
    try:
        if text and text[-1] in units:
            return float(text[:-1]) * units[text[-1]]
        return float(text)
    except ValueError:
        raise UsageError(f"--older-than: '{text}' is not an age like 7d, 12h, 30m") from None


def prune(older_than: str | None, everything: bool, dry_run: bool) -> list[dict[str, Any]]:
    """Remove entries older than ``older_than`` (or all); incomplete ones always go."""
    if not everything and older_than is None:
        raise UsageError("ortft cache prune: give --older-than AGE or --all")
    limit = 0.0 if everything else parse_age(older_than or "0")
    gone = [e for e in entries() if e["kind"] == "incomplete" or e["age_s"] >= limit]
    for e in gone if not dry_run else []:
        path = Path(e["path"])
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        Path(str(path) + ".lock").unlink(missing_ok=True)
    return gone
