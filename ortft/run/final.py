"""``<run>/final/``: the trained model in Hugging Face format (or the ONNX inference graph of an
ort-ondevice run), its tokenizer and the recipe, swapped in whole once training ends, so a
reader never sees half a final/; then the model card and a copy of summary.json beside it.
``<run>/onnx/`` is the exporter's (``ortft.export.parity.publish``), step-N and best/ are
``ortft.checkpoint``'s."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ortft.core import fsutil
from ortft.run import report
from ortft.run.summary import RunSummary

FINAL_DIR = "final"


def write(
    run_dir: Path, write_model: Callable[[Path], None], tokenizer: Any, recipe_yaml: str
) -> Path:
    """final/ from ``write_model(folder)`` (the engine's files), the tokenizer and recipe.yaml."""
    final_dir = run_dir / FINAL_DIR
    with fsutil.atomic_dir(final_dir) as tmp:
        write_model(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "recipe.yaml").write_text(recipe_yaml)
    return final_dir


def describe(final_dir: Path, summary: RunSummary, recipe: Any) -> None:
    """The model card (README.md) and summary.json, each written atomically into final/."""
    fsutil.write_text_atomic(final_dir / "README.md", report.model_card(summary, recipe))
    summary.write(final_dir / "summary.json")
