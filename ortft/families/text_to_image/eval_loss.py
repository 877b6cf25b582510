"""``ortft eval`` of a text-to-image run (its ``final/``, a diffusers Stable Diffusion folder; a
LoRA run's with its LoRA in ``final/lora/``) or of a diffusers model folder: the eval loss.

The loss is the one training's eval computes, by the same code: the loop's ``evaluate`` (its
eval batches, the last one padded and its copies weighing 0) over the task's ``collate`` with no
epoch (each row's noise, timestep and VAE sample from the task's fixed eval stream, keyed by
``training.seed`` and the row's place in the split) and the task's ``forward`` (the UNet's MSE
against the target, min-SNR weighted with ``task.snr_gamma``), in PyTorch, fp32, on the CPU.
The default data is the eval split of the run's recipe (``final/recipe.yaml``); ``--data`` scores
another file (an image path and a caption per row, or a label with ``task.caption_template``).

On the run's own eval split this repeats ``summary.json``'s ``eval_loss`` (measured: equal for
a torch run, 2e-8 apart for an ort run, whose eval ran ORTModule's graph; a run evaluated on
a GPU, to its kernels' rounding) with one exception, by design: with
``task.ema_decay`` final/ holds the EMA of the UNet's weights (as diffusers' script saves them)
while the loop evaluates the weights it trains, so ``eval_loss`` there is the live weights'
and ``ortft eval RUN`` the EMA's (the ``ema_weights`` field says which one it scored).

An ONNX export (``<run>/onnx``) is refused with one line, pointing at the run: the loss needs
the VAE's latent distribution of each eval image (training samples mean + std x noise), and the
export's graphs are made for drawing (a vae_encoder, where there is one, gives the mean alone);
its UNet's parity with PyTorch is checked when it is written (max |diff| 6e-7 on the tiny
recipe), so the run's eval scores the same UNet.
"""

from __future__ import annotations

import logging
import time
import types
from pathlib import Path
from typing import Any

import numpy as np

from ortft import tasks
from ortft.core.errors import InputError
from ortft.core.reports import EvalResult
from ortft.families.text_to_image import task as text_to_image
from ortft.inference import evaluate
from ortft.recipe.schema import TrainingSection
from ortft.recipe.task import read_task

log = logging.getLogger("ortft")


def model_folder(source: Path) -> tuple[Path, Path | None]:
    """(the diffusers folder, its run dir or None); one line for an ONNX export."""
    if (source / "unet" / "model.onnx").is_file():
        run = source.parent
        named = (run / "final" / "model_index.json").is_file()
        hint = f"`ortft eval {run}`" if named else "`ortft eval` on the run or its final/"
        raise InputError(
            f"{source}: a text-to-image ONNX export is made for drawing; the eval loss needs the "
            f"VAE's latent mean and std (training samples both), so run {hint} instead"
        )
    if (source / "final" / "model_index.json").is_file():
        return source / "final", source
    return source, source.parent if (source.parent / "summary.json").is_file() else None


def _task(recipe_yaml: Path | None) -> tuple[Any, bool]:
    """The run's text-to-image task (its resolution, crop, caption template, min-SNR; the
    defaults without a recipe) and whether the run kept an EMA; the task is built without one
    (``bind_frozen`` would keep a second copy of the weights)."""
    options = read_task(recipe_yaml) if recipe_yaml is not None else None
    if options is None or options.name != text_to_image.TextToImage.name:
        options = tasks.options(text_to_image.TextToImage.name)
    ema = options.ema_decay is not None  # type: ignore[attr-defined]
    return tasks.get(options.name, options.model_copy(update={"ema_decay": None})), ema


class _Engine:
    """What the loop's ``evaluate`` asks of an engine, for the UNet in PyTorch; ``eval_batch``
    is the torch engine's own: the task's forward (``TaskModule``) under no_grad."""

    def __init__(self, unet: Any, task: Any) -> None:
        from ortft.backends.torch.models import TaskModule

        self.module = TaskModule(unet, task)

    def eval_mode(self, on: bool) -> None:
        self.module.train(not on)

    def eval_batch(self, batch: dict[str, np.ndarray]) -> tuple[float, None]:
        import torch

        inputs = {k: torch.from_numpy(v) for k, v in batch.items() if not k.startswith("_")}
        with torch.no_grad():
            loss, _ = self.module(**inputs)
        return float(loss), None

    def extra_metrics(self, task: Any, tokenizer: Any, encoded: Any) -> dict[str, float]:
        return {}


def _bind(folder: Path, task: Any) -> tuple[Any, Any]:
    """(the tokenizer, the UNet) of ``folder``, the task bound to its frozen VAE and text
    encoder and its schedule, as training binds them (plain attention, as the UNet trained)."""
    import torch
    from diffusers.models.attention_processor import AttnProcessor

    from ortft.families.text_to_image import diffusion
    from ortft.families.text_to_image import graphs as sd_export

    diffusion.check_folder(folder, "eval")  # one line naming a missing part
    tok = diffusion.load_tokenizer(folder / "tokenizer")
    pipe = sd_export.load_pipeline(folder)  # with final/lora/ on top, as `ortft predict` draws
    unet = pipe.unet.float().eval()
    unet.set_attn_processor(AttnProcessor())
    parts = diffusion.Parts(unet, pipe.vae.float(), pipe.text_encoder.float(), tok, pipe.scheduler)
    task.bind(tok)
    task.bind_frozen(
        diffusion.Frozen(parts, torch.device("cpu")),
        diffusion.alphas_cumprod(pipe.scheduler),
        pipe.scheduler.config.get("prediction_type", "epsilon"),
        unet,
    )
    return tok, unet


def run(source: Path, data_file: Path | None = None, batch_size: int = 32) -> EvalResult:
    from ortft.run import loop

    t0 = time.perf_counter()
    folder, run_dir = model_folder(Path(source))
    recipe_yaml = folder / "recipe.yaml" if (folder / "recipe.yaml").is_file() else None
    task, ema = _task(recipe_yaml)
    # what evaluate.load_rows / training_recipe read of a saved model (one text per row)
    saved = types.SimpleNamespace(
        spec=task, path=folder, recipe_yaml=recipe_yaml, run_dir=run_dir, text_pair=None
    )
    loaded = evaluate.training_recipe(saved)  # type: ignore[arg-type]
    rows, spec, where = evaluate.load_rows(saved, data_file, loaded)  # type: ignore[arg-type]
    tok, unet = _bind(folder, task)
    encoded = task.encode(rows, tok, spec, None)
    if not len(encoded):
        raise InputError(f"{where}: no image to score")
    seed = loaded.recipe.training.seed if loaded else TrainingSection.model_fields["seed"].default
    log.info("eval: %s (pytorch) on %s: %d images", folder, where, len(encoded))
    if ema:
        log.info(
            "eval: final/ holds the EMA weights (task.ema_decay); summary.json's eval_loss is "
            "the live weights' (training evaluates those)"
        )
    # no more rows per batch than there are: eval pads the last batch with copies
    size = min(batch_size, len(encoded))
    metrics = loop.evaluate(_Engine(unet, task), encoded, task, size, seed, tok)
    return {
        "model": str(folder),
        "runtime": "pytorch",
        "task": task.name,
        "data": where,
        "examples": len(encoded),
        "max_length": None,
        "metrics": {k: float(v) for k, v in metrics.items()},
        "ema_weights": ema,
        "eval_s": round(time.perf_counter() - t0, 3),
    }
