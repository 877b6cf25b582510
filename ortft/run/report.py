"""What a run writes about itself: ``metrics.jsonl`` rows, ``summary.json`` and the model card.

summary.json: its schema is ``RunSummary`` in ortft/run/summary.py (format_version 1).

metrics.jsonl — one JSON object per line:
  {"kind": "train", "step", "epoch", "loss", "lr", "samples_per_s", "tokens_per_s", "step_time_s",
   "tokens", "padded_tokens", "batch_lengths", "tokens_sq", "time_s"}
   (step_time_s to tokens_sq: the logged step alone: its real tokens, rows × batch length summed
   over its micro-batches, each micro-batch's length, and Σ over rows of real length²)
  {"kind": "eval", "step", "epoch", "loss", and the task's metrics (accuracy, f1_macro | perplexity)}
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ortft.run.summary import BackendReport, RunSummary


def throughput(steady: dict[str, float]) -> dict[str, Any]:
    """summary.throughput from the steady-state counters both training loops keep."""
    steady_t = max(steady["time"], 1e-9)
    return {
        "samples_per_s": steady["samples"] / steady_t,
        "tokens_per_s": steady["tokens"] / steady_t,
        "first_step_s": steady["first_step_s"],
        "note": "steady state: every step of this process but its first",
    }


class MetricsLog:
    """Appends rows to metrics.jsonl (flushed per row, so a killed run keeps what it logged)."""

    def __init__(self, path: Path, truncate_after_step: int | None = None):
        self.path = path
        if truncate_after_step is not None and path.exists():
            # resuming: drop rows logged after the checkpoint we continue from
            keep = []
            for line in path.read_text().splitlines():
                try:
                    if json.loads(line).get("step", 0) <= truncate_after_step:
                        keep.append(line)
                except json.JSONDecodeError:
                    continue
            path.write_text("".join(f"{line}\n" for line in keep))
        elif truncate_after_step is None and path.exists():
            path.unlink()

    def write(self, row: dict[str, Any]) -> None:
        with open(self.path, "a") as fh:
            fh.write(json.dumps(row) + "\n")


def model_card(summary: RunSummary | dict[str, Any], recipe: Any) -> str:
    s = RunSummary.coerce(summary)  # a dict: the lifecycle's summary until it builds a RunSummary
    m = recipe.model
    base = m.name_or_path or f"{m.from_config.architecture} built from config (random init)"
    metrics = "\n".join(f"| {k} | {v:.4f} |" for k, v in s.metrics.items() if isinstance(v, float))
    b = s.backend or BackendReport(requested="?", used="?")
    return f"""---
library_name: transformers
tags: [ortft, onnxruntime, {recipe.task.name}]
---
# Fine-tuned with ortft

- **Base model:** {base}
- **Task:** {recipe.task.name}
- **Training data:** {recipe.data.train}{f" (eval: {recipe.data.eval})" if recipe.data.eval else ""}
- **Backend:** {b.used} (requested {b.requested}; fallback: {"yes" if b.fallback else "no"})
- **Steps:** {s.steps} ({s.epochs:.2f} epochs), batch size
  {recipe.training.batch_size} × accumulation {recipe.training.gradient_accumulation_steps},
  lr {recipe.training.lr} ({recipe.training.scheduler}), seed {recipe.training.seed}

| metric | value |
|---|---|
{metrics}

Recreate it with `ortft train recipe.yaml` using the `recipe.yaml` stored next to this card.
"""
