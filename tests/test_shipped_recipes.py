"""Every shipped CPU recipe trains end to end: its real model and data, 2 steps, through the CLI.

`make test-recipes` (marker `recipes`, a few minutes; not part of `make test`). Each run must exit
0 and leave final/ with the model, the ONNX export with a passing export.json where the recipe
exports, and summary.json with status completed. Validating a recipe is not enough: lora.yaml
validated for months but could not read its data (a Latin-1 byte in one BBC article).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from helpers import losses, run_cli, start_cli

from ortft.recipe import io as recipe_io
from ortft.tools import starter

RECIPES = starter.recipes_dir()
SHIPPED = sorted(path.relative_to(RECIPES).as_posix() for path, _ in starter.shipped_recipes())

# What keeps a run cheap without changing the model or the data: 2 optimizer steps, and 16
# held-out rows to score (they are also the export's parity samples).
CHEAP = ("training.max_steps=2", "data.max_eval_samples=16")

# Trained as they ship (plus CHEAP), one process each.
TRAINED = [
    "quickstart.yaml",
    "quickstart-ondevice.yaml",
    "lora.yaml",
    "causal-lm.yaml",
    "masked-lm.yaml",
    "instruction.yaml",
    "question-answering.yaml",
    "token-classification.yaml",
    "seq2seq.yaml",
    "image-classification.yaml",
    "speech-recognition.yaml",
    "sentence-embedding.yaml",
    "text-to-image.yaml",
    "text-to-image-lora.yaml",
    "bench/bert-cls.yaml",
    "bench/gpt2-clm.yaml",
    "bench/minilm-news.yaml",
    "bench/vit-digits.yaml",
    "bench/whisper-digits.yaml",
]
# Written for CUDA (hardware.device: cuda, 12 layers x hidden 768 at batch 64 x 256 tokens):
# one step of that model on 2 CPU cores is minutes, not seconds. They validate in
# test_cli_recipes.py; their CPU-sized twins (bert-cls.yaml, gpt2-clm.yaml) train here.
GPU_ONLY = ["bench/bert-cls-gpu.yaml", "bench/gpt2-clm-gpu.yaml"]
# Trained by their own tests below: torchrun, DeepSpeed, Optuna.
OWN_TEST = ["ddp.yaml", "deepspeed-zero2.yaml", "quickstart-hpo.yaml"]

# ddp.yaml and deepspeed-zero2.yaml are written for GPUs (cuda, bf16 / fp16); on a CPU machine
# they need the CPU device and fp32 (ONNX Runtime's CPU provider has no bf16 MatMul, PyTorch no
# fp16 training on CPU). Everything else in them (model, data, ORT, DDP / ZeRO-2) is as shipped.
ON_CPU = ("hardware.device=cpu", "precision=fp32")

# encoder-decoder models export two graphs (encoder.onnx + decoder.onnx), no model.onnx
TWO_GRAPH_TASKS = {"seq2seq", "speech-recognition"}


def ortft(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`python -m ortft ARGS` from ``cwd`` (not the repository root: paths must not depend on it)."""
    return run_cli(*args, cwd=cwd, env={"NO_COLOR": "1"}, timeout=900)


def train(recipe: Path, run: Path, *overrides: str, nproc: int = 1) -> dict[str, Any]:
    """Train ``recipe`` for 2 steps into ``run``; check what a finished run holds; its summary."""
    args = ["train", str(recipe), *CHEAP, *overrides, "--output-dir", str(run)]
    if nproc > 1:
        args += ["--nproc", str(nproc)]
    res = ortft(*args, cwd=run.parent)
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed", summary.get("error")
    assert summary["steps"] == 2
    assert_final_and_export(recipe_io.load(recipe, [*CHEAP, *overrides]).recipe, run, summary)
    return summary


def assert_diffusers_final(final: Path, lora: bool) -> None:
    """A text-to-image run's final/: diffusers loads it; a LoRA run's weights load on top of it
    and change what the UNet predicts."""
    import torch
    from diffusers import StableDiffusionPipeline

    pipe = StableDiffusionPipeline.from_pretrained(str(final))
    size, channels = pipe.unet.config.sample_size, pipe.unet.config.in_channels
    x, t = torch.randn(1, channels, size, size), torch.tensor([500])
    hidden = torch.randn(1, 8, pipe.text_encoder.config.hidden_size)
    with torch.no_grad():
        base = pipe.unet(x, t, hidden).sample
        if lora:
            pipe.load_lora_weights(str(final / "lora"))
            assert not torch.allclose(pipe.unet(x, t, hidden).sample, base)
    assert torch.isfinite(base).all()


def assert_final_and_export(recipe: Any, run: Path, summary: dict[str, Any]) -> None:
    final = run / "final"
    if recipe.task.name == "text-to-image":  # a diffusers folder, not a transformers model
        assert (final / "model_index.json").is_file() and (final / "recipe.yaml").is_file()
        assert summary["backend"]["used"] == "ort" and summary["export"]["passed"] is True
        report = json.loads((run / "onnx" / "export.json").read_text())
        assert sorted(report["files"]) == ["text_encoder", "unet", "vae_decoder", "vae_encoder"]
        assert all((run / "onnx" / f).is_file() for f in report["files"].values())
        assert_diffusers_final(final, lora=recipe.adapter is not None)
        return
    assert (final / "config.json").is_file() and (final / "recipe.yaml").is_file()
    if recipe.backend.name == "ort-ondevice":
        # the on-device engine's trained model is an ONNX graph, and it is the export: parity
        # against the eval graph is in summary.json (no onnx/ folder, no export.json)
        assert (final / "model.onnx").is_file()
        assert summary["export"]["passed"] is True, summary["export"]
        return
    assert (final / "model.safetensors").is_file()
    if recipe.adapter is not None:
        assert (final / "adapter" / "adapter_model.safetensors").is_file()
    if not recipe.export.enabled:
        assert summary["export"] is None and not (run / "onnx").exists()
    else:
        report = json.loads((run / "onnx" / "export.json").read_text())
        graphs = (
            ("encoder.onnx", "decoder.onnx")
            if recipe.task.name in TWO_GRAPH_TASKS
            else ("model.onnx",)
        )
        assert all((run / "onnx" / g).is_file() for g in graphs), sorted(os.listdir(run / "onnx"))
        assert report["passed"] is True and report["parity"]["passed"] is True, report
        assert summary["export"]["passed"] is True


def test_every_shipped_recipe_has_a_place_in_the_tier() -> None:
    """Fast (in `make test`): a new recipe must be trained here or say why not."""
    listed = TRAINED + GPU_ONLY + OWN_TEST
    assert len(listed) == len(set(listed))
    assert sorted(listed) == SHIPPED


@pytest.mark.recipes
@pytest.mark.parametrize("name", TRAINED)
def test_shipped_recipe_trains_end_to_end(name: str, tmp_path: Path) -> None:
    train(RECIPES / name, tmp_path / "run")


@pytest.mark.recipes
def test_ddp_recipe_trains_in_two_processes(tmp_path: Path) -> None:
    """`ortft train recipes/ddp.yaml --nproc 2`: torchrun, 2 gloo processes, ORTModule + DDP."""
    summary = train(RECIPES / "ddp.yaml", tmp_path / "run", *ON_CPU, nproc=2)
    assert summary["distributed"] == {"world_size": 2, "backend": "gloo"}


@pytest.mark.recipes
def test_deepspeed_recipe_trains_in_two_processes(tmp_path: Path) -> None:
    """ZeRO-2 + ORTModule over 2 gloo processes (DeepSpeed's CPU accelerator), as
    test_deepspeed.py runs it on a tiny model."""
    summary = train(RECIPES / "deepspeed-zero2.yaml", tmp_path / "run", *ON_CPU, nproc=2)
    assert summary["distributed"] == {"world_size": 2, "backend": "gloo"}
    assert summary["backend"]["used"] == "ort"


@pytest.mark.recipes
def test_hpo_recipe_searches_then_its_best_recipe_trains(tmp_path: Path) -> None:
    """`ortft hpo --trials 1` (trials skip the export), then `ortft train` of the best recipe it
    writes: the recipe with the trial's parameters, exported as the recipe asks."""
    out = tmp_path / "hpo"
    res = ortft(
        "hpo",
        str(RECIPES / "quickstart-hpo.yaml"),
        *CHEAP,
        "--trials",
        "1",
        "--output-dir",
        str(out),
        "--json",
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    study = json.loads(res.stdout)
    assert [t["state"] for t in study["trials"]] == ["complete"]
    trial = json.loads((out / "trial-000" / "summary.json").read_text())
    assert trial["status"] == "completed" and trial["steps"] == 2
    best = Path(study["best"]["recipe"])
    assert best == out / "quickstart-hpo-best.yaml"
    train(best, tmp_path / "best")


@pytest.mark.recipes
def test_quickstart_on_ort_with_dropout_resumes_exactly_after_kill_9(tmp_path: Path) -> None:
    """The real quickstart shapes (MiniLM, batch 16, max_length 128) with its dropout on, on the
    ort backend: killed with kill -9 right after step 4's checkpoint and resumed, steps 5-8 give
    the uninterrupted run's losses. ORT's dropout masks come from its own generator, which no
    checkpoint holds; ortft reseeds it per micro-batch from the seed and the micro-step."""
    import signal
    import time

    args = ["train", str(RECIPES / "quickstart.yaml"), "training.max_steps=8",
            "checkpoint.save_every=4", "training.log_every=1", "export.enabled=false",
            "data.max_eval_samples=16"]  # fmt: skip
    full, cut = tmp_path / "full", tmp_path / "cut"
    res = ortft(*args, "--output-dir", str(full), cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    with open(tmp_path / "cut.err", "w") as err:
        proc = start_cli(
            *args, "--output-dir", str(cut), stdout=subprocess.DEVNULL, stderr=err, cwd=tmp_path
        )
    deadline = time.monotonic() + 600
    while not (cut / "step-000004" / "manifest.json").exists():
        assert proc.poll() is None, (tmp_path / "cut.err").read_text()[-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    res = ortft(*args, "--output-dir", str(cut), cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    resumed = json.loads((cut / "summary.json").read_text())
    assert resumed["resumed_from"].endswith("step-000004") and resumed["backend"]["used"] == "ort"

    want, got = losses(full, by_step=True), losses(cut, by_step=True)
    assert sorted(got) == list(range(1, 9))
    assert [got[s] for s in range(5, 9)] == pytest.approx([want[s] for s in range(5, 9)], abs=1e-6)
