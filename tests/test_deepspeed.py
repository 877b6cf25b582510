"""DeepSpeed ZeRO: the recipe's deepspeed config checked against the recipe, completed from it,
a clear error without DeepSpeed, and (when the extra is installed) ZeRO-2 + ORTModule on CPU."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import tiny_classifier, train_losses, write_classification_csv, write_recipe

from ortft.backends import deepspeed as zero
from ortft.errors import RecipeError
from ortft.recipe import io as recipe_io

has_deepspeed = importlib.util.find_spec("deepspeed") is not None


def recipe_dict(**deepspeed: object) -> dict:
    r = tiny_classifier("train.csv", max_steps=3, batch_size=8, gradient_accumulation_steps=2)
    r["data"]["eval_fraction"] = 0.0
    r["export"] = {"enabled": False}
    r["deepspeed"] = deepspeed
    return r


def load(tmp_path: Path, r: dict, *overrides: str):
    write_classification_csv(tmp_path / "train.csv")
    return recipe_io.load(write_recipe(tmp_path / "r.yaml", r), list(overrides))


@pytest.mark.parametrize(
    "config, needle",
    [
        (
            {"train_micro_batch_size_per_gpu": 4},
            "train_micro_batch_size_per_gpu=4 but training.batch_size=8",
        ),
        (
            {"gradient_accumulation_steps": 1},
            "gradient_accumulation_steps=1 but training.gradient_accumulation_steps=2",
        ),
        (
            {"train_batch_size": 20},
            "train_batch_size=20 is not a multiple of batch_size x accumulation (16)",
        ),
        ({"fp16": {"enabled": True}}, "fp16.enabled but precision.dtype=fp32"),
        ({"bf16": {"enabled": True}}, "bf16.enabled but precision.dtype=fp32"),
        ({"gradient_clipping": 0.5}, "gradient_clipping=0.5 but training.max_grad_norm=1.0"),
        ({"optimizer": {"type": "Adam"}}, "optimizer: ortft builds the optimizer from the recipe"),
        ({"scheduler": {"type": "WarmupLR"}}, "scheduler: ortft builds the scheduler"),
        (
            {"zero_optimization": {"stage": 3}},
            "ZeRO stages 0, 1 and 2 (stage 3 partitions parameters",
        ),
    ],
)
def test_inline_config_disagreeing_with_the_recipe_is_a_recipe_error(
    tmp_path: Path, config: dict, needle: str
) -> None:
    with pytest.raises(RecipeError) as info:
        load(tmp_path, recipe_dict(**config))
    assert needle in str(info.value)


def test_json_file_gets_the_same_checks(tmp_path: Path) -> None:
    (tmp_path / "ds.json").write_text(json.dumps({"train_micro_batch_size_per_gpu": 2}))
    r = recipe_dict()
    r["deepspeed"] = "ds.json"
    with pytest.raises(
        RecipeError, match="train_micro_batch_size_per_gpu=2 but training.batch_size=8"
    ):
        load(tmp_path, r)
    (tmp_path / "ds.json").write_text("{not json")
    with pytest.raises(RecipeError, match="not JSON"):
        load(tmp_path, r)
    (tmp_path / "ds.json").write_text(
        json.dumps({"zero_optimization": {"stage": 1}, "train_batch_size": "auto"})
    )
    assert load(tmp_path, r).recipe.deepspeed == "ds.json"


def test_other_combinations(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match="needs backend.name=ort or torch"):
        load(tmp_path, recipe_dict(), "backend.name=auto")
    with pytest.raises(
        RecipeError, match="checkpoint.save_every: DeepSpeed runs write no resumable"
    ):
        load(tmp_path, recipe_dict(), "checkpoint.save_every=2")


def test_config_is_completed_from_the_recipe(tmp_path: Path) -> None:
    loaded = load(
        tmp_path,
        recipe_dict(
            zero_optimization={"stage": 2},
            train_batch_size="auto",
            fp16={"initial_scale_power": 12},
        ),
    )
    cfg = zero.config(zero.read(loaded.recipe.deepspeed, tmp_path), loaded.recipe, world=4)
    assert cfg["train_micro_batch_size_per_gpu"] == 8
    assert cfg["gradient_accumulation_steps"] == 2
    assert cfg["train_batch_size"] == 8 * 2 * 4  # batch x accumulation x world size
    assert cfg["gradient_clipping"] == 1.0
    assert cfg["fp16"] == {"initial_scale_power": 12, "enabled": False}  # precision.dtype=fp32
    assert cfg["bf16"] == {"enabled": False}
    assert cfg["zero_optimization"] == {"stage": 2}
    # the world size is known at run time: a total that does not fit it is refused then
    with pytest.raises(ValueError, match=r"train_batch_size=32 but .* x 4 = 64"):
        zero.config({"train_batch_size": 32}, loaded.recipe, world=4)


def test_missing_deepspeed_is_one_clear_error(tmp_path: Path) -> None:
    """A deepspeed package that cannot be imported (simulated): one line, exit 1, no traceback."""
    fake = tmp_path / "fake"
    (fake / "deepspeed").mkdir(parents=True)
    (fake / "deepspeed" / "__init__.py").write_text(
        "raise ImportError('No module named deepspeed')\n"
    )
    load(tmp_path, recipe_dict(zero_optimization={"stage": 2}))
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "ortft",
            "train",
            str(tmp_path / "r.yaml"),
            "backend.name=torch",
            "--output-dir",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(fake)},
        timeout=600,
        check=False,
    )
    assert res.returncode == 1
    assert "recipe sets deepspeed but DeepSpeed cannot be imported" in res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.skipif(not has_deepspeed, reason="the deepspeed extra is not installed")
def test_zero2_with_ortmodule_on_cpu_matches_one_process(tmp_path: Path) -> None:
    """DeepSpeed's CPU accelerator, 2 gloo processes, ORTModule inside the engine: the losses of
    one process with the same global batch (measured: equal to ~6e-8)."""
    load(
        tmp_path,
        recipe_dict(zero_optimization={"stage": 2}),
        "training.gradient_accumulation_steps=1",
    )
    path = tmp_path / "r.yaml"
    env = {**os.environ, "NO_COLOR": "1"}
    ds = subprocess.run(
        [
            sys.executable,
            "-m",
            "ortft",
            "train",
            str(path),
            "training.gradient_accumulation_steps=1",
            "--nproc",
            "2",
            "--output-dir",
            str(tmp_path / "ds"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert ds.returncode == 0, ds.stderr[-3000:]
    one = subprocess.run(
        [
            sys.executable,
            "-m",
            "ortft",
            "train",
            str(path),
            "training.gradient_accumulation_steps=1",
            "training.batch_size=16",
            "deepspeed=null",
            "--output-dir",
            str(tmp_path / "one"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert one.returncode == 0, one.stderr[-3000:]
    assert train_losses(tmp_path / "ds") == pytest.approx(train_losses(tmp_path / "one"), rel=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(
    not (has_deepspeed and torch.cuda.is_available()), reason="needs deepspeed and a CUDA GPU"
)
def test_zero2_fp16_on_cuda(tmp_path: Path) -> None:
    load(tmp_path, recipe_dict(zero_optimization={"stage": 2}), "precision.dtype=fp16")
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "ortft",
            "train",
            str(tmp_path / "r.yaml"),
            "precision.dtype=fp16",
            "hardware.device=cuda",
            "--output-dir",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["precision"]["dtype"] == "fp16"
