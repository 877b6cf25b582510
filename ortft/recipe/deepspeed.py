"""The recipe's ``deepspeed:`` section (ZeRO stages 0-2), checked and completed: torch-free.

The recipe stays the one source of truth: batch sizes, accumulation, clipping and precision
come from it, and a DeepSpeed config that says otherwise is a recipe error (``check``), not a
silent override. ``config`` fills the values DeepSpeed needs (``"auto"`` or absent) from the
recipe and the world size. ortft builds the optimizer and scheduler itself, so a config with
its own ``optimizer``/``scheduler`` is refused.

ZeRO stage 3 partitions the parameters themselves; ORTModule's exported graph needs whole
parameters (ORT 1.19 documents stages 1 and 2 with ORTModule), so stage 3 is refused.
The engine side (DeepSpeed's engine, its checkpoint partitions) is
``ortft.backends.torch.deepspeed``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

STAGES = (0, 1, 2)


def read(value: str | dict[str, Any], base_dir: Path) -> dict[str, Any]:
    """The config mapping: inline, or read from a JSON file (relative to the recipe)."""
    if isinstance(value, dict):
        return value
    path = Path(value) if Path(value).is_absolute() else base_dir / value
    try:
        data = json.loads(path.read_text())
    except OSError as err:
        raise ValueError(f"cannot read {path}: {err.strerror or err}") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not JSON ({err})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a JSON object is needed")
    return data


def _given(cfg: dict[str, Any], key: str) -> Any:
    value = cfg.get(key)
    return None if value == "auto" else value


def check(cfg: dict[str, Any], recipe: Any, world: int | None = None) -> list[str]:
    """Every way ``cfg`` disagrees with ``recipe`` (and, when known, the world size)."""
    t, problems = recipe.training, []
    if recipe.backend.name not in ("ort", "torch"):
        problems.append(f"needs backend.name=ort or torch, not {recipe.backend.name}")
    zero = cfg.get("zero_optimization", {})
    stage = zero.get("stage", 0) if isinstance(zero, dict) else None
    if stage not in STAGES:
        problems.append(
            f"zero_optimization.stage={stage}: ortft supports ZeRO stages 0, 1 and 2 "
            "(stage 3 partitions parameters, which ORTModule cannot export)"
        )
    micro = _given(cfg, "train_micro_batch_size_per_gpu")
    if micro is not None and micro != t.batch_size:
        problems.append(
            f"train_micro_batch_size_per_gpu={micro} but training.batch_size={t.batch_size}"
        )
    gas = _given(cfg, "gradient_accumulation_steps")
    if gas is not None and gas != t.gradient_accumulation_steps:
        problems.append(
            f"gradient_accumulation_steps={gas} but training.gradient_accumulation_steps="
            f"{t.gradient_accumulation_steps}"
        )
    total, per_rank = _given(cfg, "train_batch_size"), t.batch_size * t.gradient_accumulation_steps
    if total is not None:
        if world is not None and total != per_rank * world:
            problems.append(
                f"train_batch_size={total} but batch_size x accumulation x world size = "
                f"{t.batch_size} x {t.gradient_accumulation_steps} x {world} = {per_rank * world}"
            )
        elif total % per_rank:
            problems.append(
                f"train_batch_size={total} is not a multiple of batch_size x accumulation "
                f"({per_rank})"
            )
    clip = _given(cfg, "gradient_clipping")
    if clip is not None and clip != (t.max_grad_norm or 0.0):
        problems.append(f"gradient_clipping={clip} but training.max_grad_norm={t.max_grad_norm}")
    if recipe.precision.dtype == "auto":  # DeepSpeed casts the model itself, from its config
        problems.append("precision.dtype=auto: name fp32, bf16 or fp16 with a deepspeed config")
    for key in ("fp16", "bf16"):
        enabled = (cfg.get(key) or {}).get("enabled", False)
        if enabled not in (False, "auto") and recipe.precision.dtype != key:
            problems.append(f"{key}.enabled but precision.dtype={recipe.precision.dtype}")
    for key in ("optimizer", "scheduler"):
        if key in cfg:
            problems.append(
                f"{key}: ortft builds the {key} from the recipe; remove it from the config"
            )
    return problems


def config(cfg: dict[str, Any], recipe: Any, world: int) -> dict[str, Any]:
    """``cfg`` completed from the recipe (raises ValueError on a disagreement)."""
    problems = check(cfg, recipe, world)
    if problems:
        raise ValueError("; ".join(problems))
    t, dtype = recipe.training, recipe.precision.dtype
    out = json.loads(json.dumps(cfg))  # a deep copy
    out["train_micro_batch_size_per_gpu"] = t.batch_size
    out["gradient_accumulation_steps"] = t.gradient_accumulation_steps
    out["train_batch_size"] = t.batch_size * t.gradient_accumulation_steps * world
    out["gradient_clipping"] = t.max_grad_norm or 0.0
    out["fp16"] = {**(cfg.get("fp16") or {}), "enabled": dtype == "fp16"}
    out["bf16"] = {**(cfg.get("bf16") or {}), "enabled": dtype == "bf16"}
    out.setdefault("zero_optimization", {"stage": 0})
    out.setdefault(
        "zero_allow_untested_optimizer", True
    )  # ortft's torch AdamW, not a DeepSpeed one
    out.setdefault("steps_per_print", 10**9)  # ortft logs; DeepSpeed stays quiet
    return out
