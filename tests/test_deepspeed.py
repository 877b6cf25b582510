"""DeepSpeed ZeRO: the recipe's deepspeed config checked against the recipe, completed from it,
a clear error when DeepSpeed cannot be imported, and ZeRO 1 and 2 run for real on CPU (DeepSpeed
0.19.8, installed by `make setup`): 2 gloo processes on both backends, checkpoints and resume."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import tiny_classifier, write_classification_csv, write_recipe
from helpers import losses, run_cli

from ortft.backends.torch import deepspeed as zero
from ortft.core.errors import RecipeError
from ortft.recipe import io as recipe_io


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
    res = run_cli(
        "train",
        str(tmp_path / "r.yaml"),
        "backend.name=torch",
        "--output-dir",
        str(tmp_path / "run"),
        env={"NO_COLOR": "1", "PYTHONPATH": str(fake)},
        timeout=600,
    )
    assert res.returncode == 1
    assert "recipe sets deepspeed but DeepSpeed cannot be imported" in res.stderr
    assert "Traceback" not in res.stderr


def train(recipe: Path, run: Path, *overrides: str, nproc: int = 1) -> subprocess.CompletedProcess:
    args = ["train", str(recipe), *overrides, "--output-dir", str(run)]
    return run_cli(
        *args, *(["--nproc", str(nproc)] if nproc > 1 else []), env={"NO_COLOR": "1"}, timeout=600
    )


@pytest.fixture(scope="module")
def one_process() -> dict[str, list[float]]:
    """Per backend: the losses of one process without DeepSpeed at batch 16 (run once, by the
    first test of that backend)."""
    return {}


@pytest.mark.parametrize(
    "backend, stage",
    [("torch", 1), ("torch", 2), pytest.param("ort", 1, marks=pytest.mark.ort),
     pytest.param("ort", 2, marks=pytest.mark.ort)],
)  # fmt: skip
def test_zero_in_two_processes_matches_one_process(
    tmp_path: Path, one_process: dict[str, list[float]], backend: str, stage: int
) -> None:
    """DeepSpeed's CPU accelerator, 2 gloo processes, ZeRO 1 or 2 around the eager model or
    ORTModule, with gradient accumulation: the losses of one process with the same global batch
    (2 processes x 8 rows x 2 micro-batches = 16 rows x 2 micro-batches)."""
    load(tmp_path, recipe_dict(zero_optimization={"stage": stage}))
    recipe, common = tmp_path / "r.yaml", [f"backend.name={backend}"]
    res = train(recipe, tmp_path / "ds", *common, "--json", nproc=2)
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads(res.stdout)  # DeepSpeed's log lines go to stderr, not among the results
    assert summary["distributed"] == {"world_size": 2, "backend": "gloo"}
    assert summary["backend"]["used"] == backend and summary["samples"] == 3 * 32
    if backend not in one_process:
        res = train(recipe, tmp_path / "one", *common, "training.batch_size=16", "deepspeed=null")
        assert res.returncode == 0, res.stderr[-3000:]
        one_process[backend] = losses(tmp_path / "one")
    # measured: equal to 9e-8 (the reductions sum the two halves in another order)
    assert losses(tmp_path / "ds") == pytest.approx(one_process[backend], rel=1e-5)


def test_zero2_checkpoints_resume_in_deepspeeds_format(tmp_path: Path) -> None:
    """Every process writes its optimizer partition through DeepSpeed (step-N/deepspeed/); a run
    cut after step 2 resumes from it and follows the uninterrupted run; final/ is a plain
    Hugging Face model; another process count is refused before anything runs."""
    load(tmp_path, recipe_dict(zero_optimization={"stage": 2}))
    run = tmp_path / "run"
    args = ["backend.name=torch", "training.max_steps=4", "checkpoint.save_every=2"]
    res = train(tmp_path / "r.yaml", run, *args, "checkpoint.keep_last=3", nproc=2)
    assert res.returncode == 0, res.stderr[-3000:]
    full = losses(run)
    step2 = run / "step-000002"
    assert sorted(p.name for p in (step2 / "deepspeed" / "zero").iterdir()) == [
        "mp_rank_00_model_states.pt",
        "zero_pp_rank_0_mp_rank_00_optim_states.pt",
        "zero_pp_rank_1_mp_rank_00_optim_states.pt",
    ]
    assert not (step2 / "optimizer.pt").exists()
    manifest = json.loads((step2 / "manifest.json").read_text())
    assert manifest["kind"] == "ortft-deepspeed-checkpoint"
    assert "deepspeed/zero/zero_pp_rank_1_mp_rank_00_optim_states.pt" in manifest["files"]
    from transformers import AutoModelForSequenceClassification

    assert sorted(p.name for p in (run / "final").glob("*.safetensors")) == ["model.safetensors"]
    AutoModelForSequenceClassification.from_pretrained(run / "final")
    for name in ("final", "step-000004", "summary.json"):  # as if killed after step 2's save
        target = run / name
        shutil.rmtree(target) if target.is_dir() else target.unlink()
    res = train(tmp_path / "r.yaml", run, *args, "checkpoint.keep_last=3", nproc=2)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "resuming from" in res.stderr
    assert losses(run) == pytest.approx(full, abs=1e-7)
    # ZeRO keeps one partition per process: one process cannot take over two partitions
    (run / "summary.json").unlink()
    res = train(tmp_path / "r.yaml", run, *args, "training.max_steps=6")
    assert res.returncode == 2, res.stderr[-3000:]
    assert "partitioned over 2 processes, this run has 1" in res.stderr


def test_deepspeeds_accelerator_is_the_runs_device() -> None:
    """In a fresh process: DeepSpeed's CPU accelerator reads the CPU's features through
    py-cpuinfo, which swaps sys.stdout and fails under pytest's capture once other tests ran."""
    code = (
        "import deepspeed, pytest\n"
        "from ortft.backends.torch import deepspeed as zero\n"
        "from ortft.core.errors import BackendError\n"
        "name = deepspeed.accelerator.get_accelerator().device_name()\n"
        "zero._check_accelerator(deepspeed, name)\n"
        "other = 'cuda' if name == 'cpu' else 'cpu'\n"
        "with pytest.raises(BackendError, match=f\"DeepSpeed's accelerator is {name} but this run's\"):\n"
        "    zero._check_accelerator(deepspeed, other)\n"
        "print('checked', name)\n"
    )
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120)  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    assert "checked cpu" in res.stdout


def test_partitions_load_with_weights_only(tmp_path: Path) -> None:
    """DeepSpeed's own loader unpickles anything (weights_only=False); ortft's allows tensors,
    plain data and DeepSpeed's few classes, nothing else."""
    import fractions

    from deepspeed.runtime.zero.config import ZeroStageEnum

    ok, evil = tmp_path / "ok.pt", tmp_path / "evil.pt"
    torch.save({"zero_stage": ZeroStageEnum.gradients, "x": torch.ones(2)}, ok)
    assert zero._load_weights_only(str(ok))["zero_stage"] == ZeroStageEnum.gradients
    torch.save({"x": fractions.Fraction(1, 3)}, evil)  # any class outside the list
    with pytest.raises(Exception, match="Weights only load failed"):
        zero._load_weights_only(str(evil))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_zero2_fp16_on_cuda(tmp_path: Path) -> None:
    load(tmp_path, recipe_dict(zero_optimization={"stage": 2}), "precision.dtype=fp16")
    res = run_cli(
        "train",
        str(tmp_path / "r.yaml"),
        "precision.dtype=fp16",
        "hardware.device=cuda",
        "--output-dir",
        str(tmp_path / "run"),
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["precision"]["dtype"] == "fp16"
