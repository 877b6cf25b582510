"""Image folders bigger than memory: peak RSS and the time to the first step against file count.

Run (``make bench-image-rss``; about 3 minutes at 10k and 100k images on 2 quiet CPU cores, half
a minute more the first time, which writes the files; not in CI):

    python benchmarks/image_rss.py --images 10000,100000 --phases  # -> results/image-rss.json

For each count N it writes N small PNGs (16x16 RGB, 10 classes, a folder of class sub-folders
``0/`` .. ``9/``; each file unique: its class's seeded noise with the file's index in its first
pixels, encoded by hand with zlib in 20 us where Pillow takes 230 us) under ``--work`` (kept: a
second invocation reuses them; 100k files took 21.5 s to write at load average 5), then runs
``ortft train`` on it twice, each in its own process: on an empty ``ORTFT_CACHE`` (first) and
again with the cache it left (second). The run: a tiny ViT like tests/conftest.py's
``tiny_image_classifier`` (image_size 8, patch 4, hidden 32, 2 layers, ~19k parameters), batch
32, 20 steps, backend ort, ``data.eval_fraction`` 0.01 (its end-of-run eval decodes 1% of the
files), no export, no checkpoints. Measured per run:

- ``peak_rss_mb``: the child's ``ru_maxrss`` (a wrapper process waits for it);
- ``to_data_ready_s``: from the launch to ortft's ``data:`` line (the rows read into Arrow and
  every file checked, or both found in the cache); ``check_s``: what that line says the check
  took (Pillow decodes every image once);
- ``to_first_step_s``: from the launch to the start of step 1 (the first metrics.jsonl row
  appears when step 1 ends; its ``step_time_s``, which holds ORT's export, is subtracted).

``--phases`` also runs ortft's data path in one process, phase by phase (reading the rows into
Arrow, the label names, the file check, an epoch's order), and records RSS after each: what
grows with N, if anything does. It runs right after the two trainings, so its files are in the
page cache; the first training's check may not find them there (files written long before and
evicted: 0.39-1.4 ms a file from disk against 60 us hot, measured on this VM).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
CLASSES, SIDE = 10, 16
PNG_SIG = b"\x89PNG\r\n\x1a\n"


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png(pixels: np.ndarray) -> bytes:
    """An 8-bit RGB PNG of ``pixels`` (uint8 [h, w, 3]): no filter, zlib level 1. Pillow's own
    encoder took 230-330 us a 16x16 file here, this 20 us (Pillow decodes it to the same pixels):
    100k files are then bound by creating the files, not by encoding them."""
    h, w, _ = pixels.shape
    rows = np.concatenate([np.zeros((h, 1), np.uint8), pixels.reshape(h, w * 3)], axis=1)
    header = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return (
        PNG_SIG
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", zlib.compress(rows.tobytes(), 1))
        + _chunk(b"IEND", b"")
    )


def write_images(folder: Path, n: int, seed: int = 0) -> dict:
    """``n`` PNGs in ``folder/<class>/``, file i in class i % 10; skipped when ``folder`` holds
    them already (its ``.complete`` marker says how many)."""
    marker = folder / ".complete"
    if marker.exists() and marker.read_text().strip() == str(n):
        return {"written": False}
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    bases = rng.integers(0, 256, (CLASSES, SIDE, SIDE, 3), dtype=np.uint8)
    for c in range(CLASSES):
        (folder / str(c)).mkdir(parents=True, exist_ok=True)
    size = 0
    for i in range(n):
        c = i % CLASSES
        pixels = bases[c].copy()
        pixels[0, :4].flat[:12] = np.frombuffer(i.to_bytes(12, "little"), np.uint8)
        data = png(pixels)
        size += len(data)
        (folder / str(c) / f"{i:07d}.png").write_bytes(data)
    marker.write_text(str(n))
    return {"written": True, "write_s": round(time.perf_counter() - t0, 1), "mb": size / 2**20}


def recipe(images: Path, folder: Path, backend: str) -> Path:
    text = f"""model:
  from_config:
    architecture: vit
    hidden_size: 32
    num_layers: 2
    num_heads: 2
    intermediate_size: 64
    options: {{image_size: 8, patch_size: 4}}
  dropout: 0.0
task: image-classification
data:
  train: {images}
  eval_fraction: 0.01
training:
  max_steps: 20
  batch_size: 32
  lr: 3.0e-3
  log_every: 1
  eval_every: null
backend:
  name: {backend}
checkpoint:
  save_every: null
export:
  enabled: false
"""
    path = folder / "image-rss.yaml"
    path.write_text(text)
    return path


RSS = r"""
import resource, subprocess, sys
code = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL).returncode  # stderr passes
print(code, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""
CHECKED = re.compile(r"files checked in ([0-9.]+)s")


def train_once(recipe_path: Path, run_dir: Path, env: dict) -> dict:
    cmd = [sys.executable, "-c", RSS, sys.executable, "-m", "ortft", "train", str(recipe_path),
           "--output-dir", str(run_dir)]  # fmt: skip
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    seen: dict = {}

    def watch() -> None:  # when ortft logs that the data is ready, and its last lines
        for line in proc.stderr:
            if " data: " in line and "data" not in seen:
                seen["data"], seen["data_line"] = time.time(), line.strip()
            seen["tail"] = line

    reader = threading.Thread(target=watch, daemon=True)
    reader.start()
    metrics, first_row_at = run_dir / "metrics.jsonl", None
    while proc.poll() is None:
        if first_row_at is None and metrics.exists() and metrics.read_text().strip():
            first_row_at = time.time()
        time.sleep(0.05)
    reader.join(5)
    code, maxrss_kb = proc.stdout.read().split()
    if int(code) != 0:
        raise SystemExit(f"ortft train failed ({code}) in {run_dir}: {seen.get('tail')}")
    row = json.loads(metrics.read_text().splitlines()[0])
    checked = CHECKED.search(seen.get("data_line", ""))
    return {
        "peak_rss_mb": round(int(maxrss_kb) / 1024),
        "to_data_ready_s": round(seen["data"] - t0, 1),
        "check_s": float(checked.group(1)) if checked else None,  # None: a cache hit
        "to_first_step_s": round(first_row_at - t0 - row["step_time_s"], 1),
        "wall_s": round(time.time() - t0, 1),
        "data_line": seen.get("data_line", "").split(" data: ", 1)[-1],
    }


# one process: ortft's data path phase by phase, RSS (VmRSS, and the peak VmHWM) after each
PHASES = r"""
import json, sys, time
from pathlib import Path

def rss():
    f = dict(l.split(":", 1) for l in open("/proc/self/status"))
    keys = ("VmRSS", "VmHWM", "RssAnon", "RssFile")
    return {k: round(int(f[k].split()[0]) / 1024, 1) for k in keys}

out = {"start": rss()}
t = time.perf_counter()
def mark(name):
    global t
    out[name] = {**rss(), "s": round(time.perf_counter() - t, 2)}
    t = time.perf_counter()

from ortft import tasks
from ortft.data import rows as data, splits
from ortft.recipe import io
mark("imports")
loaded = io.load(Path(sys.argv[1]))
spec, task = loaded.recipe.data, tasks.get("image-classification")
raw = splits.load_splits(spec, loaded.base_dir, task, seed=42)
mark("rows_read")
labels = data.label_names(raw.train, spec)
mark("label_names")
label2id = {n: i for i, n in enumerate(labels)}
train, evals = splits.encode_splits(task, raw, None, spec, label2id)
mark("files_checked")
from ortft.data import batches
order = batches.epoch_order(train, 32, 42, 0, True, False)
first = train.take(order[:32])
mark("epoch_order")
print(json.dumps(out))
"""


def phases(recipe_path: Path, env: dict) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", PHASES, str(recipe_path)],
        env=env, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return json.loads(out.strip().splitlines()[-1])


def bench(n: int, work: Path, backend: str, with_phases: bool) -> dict:
    folder = work / f"images-{n}"
    images = folder / "images"
    result: dict = {"images": n, "generate": write_images(images, n)}
    recipe_path = recipe(images, folder, backend)
    env = {**os.environ, "ORTFT_CACHE": str(folder / "cache"), "PYTHONPATH": str(ROOT),
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "NO_COLOR": "1"}  # fmt: skip
    for old in ("cache", "run-1", "run-2", "phases-cache"):
        subprocess.run(["rm", "-rf", str(folder / old)], check=True)
    result["load_avg_before"] = list(os.getloadavg())
    result["first"] = train_once(recipe_path, folder / "run-1", env)
    result["second"] = train_once(recipe_path, folder / "run-2", env)
    if with_phases:  # on its own empty cache: the check pass runs again
        result["phases"] = phases(recipe_path, {**env, "ORTFT_CACHE": str(folder / "phases-cache")})
    result["load_avg_after"] = list(os.getloadavg())
    return result


def verdict(results: list[dict]) -> dict | None:
    """The target: peak RSS at the largest N within +10% or +50 MB of the smallest, per run."""
    if len(results) < 2:
        return None
    small, big = results[0], results[-1]
    out = {}
    for run in ("first", "second"):
        a, b = small[run]["peak_rss_mb"], big[run]["peak_rss_mb"]
        out[run] = {
            "growth_mb": b - a,
            "growth_pct": round(100 * (b - a) / a, 1),
            "within_target": b - a <= max(50, 0.1 * a),
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", default="10000,100000", help="comma-separated file counts")
    ap.add_argument("--backend", default="ort", help="backend.name of the runs")
    ap.add_argument("--phases", action="store_true", help="also RSS after each data phase")
    ap.add_argument(
        "--work", type=Path, default=Path(tempfile.gettempdir()) / "ortft-bench-image-rss"
    )
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "image-rss.json")
    args = ap.parse_args()
    results: list[dict] = []
    for n in [int(x) for x in args.images.split(",")]:
        results.append(bench(n, args.work, args.backend, args.phases))
        print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    doc = {"format_version": 1, "results": results, "target": verdict(results)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
