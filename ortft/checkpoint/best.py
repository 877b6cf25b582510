"""``<run>/best/``: the best eval's weights (``model.safetensors``) and ``best.json`` (step,
value, metrics), replaced atomically each time an eval beats the best so far; nothing prunes
it. Which eval is better is ``ortft.run.early_stopping``'s call; this module only writes and
reads the folder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ortft.checkpoint.store import TrainState, save_weights
from ortft.core import fsutil

if TYPE_CHECKING:
    import torch

BEST_DIR = "best"


def save_best(run_dir: Path, model: torch.nn.Module, state: TrainState) -> Path:
    """Write ``best/`` (weights + best.json) atomically, replacing the previous best."""
    final = run_dir / BEST_DIR
    meta = {
        "step": state.step,
        "value": state.best_value,
        "metrics": {f"eval_{k}": v for k, v in state.eval_metrics.items()},
    }
    with fsutil.atomic_dir(final) as tmp:  # the previous best/ stays readable until the swap
        save_weights(model, tmp / "model.safetensors")
        (tmp / "best.json").write_text(json.dumps(meta, indent=2))
    return final


def read_best(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / BEST_DIR / "best.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
