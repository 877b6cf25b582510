"""``ortft predict RUN --prompt "..." -o out.png``: draw with a text-to-image run's model.

The run's ``final/`` is a diffusers Stable Diffusion folder; a LoRA run's holds the base model and
its LoRA weights in ``final/lora/``, loaded on top (``pipe.load_lora_weights``). Drawing is
diffusers' own ``StableDiffusionPipeline`` in PyTorch, with the scheduler saved in the folder,
seeded by ``--seed`` (a ``torch.Generator`` on the CPU: the same seed draws the same image).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ortft.core import fsutil
from ortft.core.errors import InputError

log = logging.getLogger("ortft")

LORA_DIR, LORA_FILE = "lora", "pytorch_lora_weights.safetensors"


@dataclass(frozen=True)
class DrawOptions:
    prompt: str
    negative_prompt: str | None = None
    guidance_scale: float = 7.5
    height: int | None = None  # default: the UNet's sample size x the VAE's scale
    width: int | None = None
    steps: int = 20
    seed: int = 0


def model_folder(source: Path) -> Path | None:
    """The diffusers folder of ``source`` (a run dir or a model folder), or None."""
    for folder in (source / "final", source):
        if (folder / "model_index.json").is_file():
            return folder
    return None


def load_pipeline(folder: Path) -> Any:
    """diffusers' pipeline of ``folder`` (fp32, CPU), LoRA weights applied where it has them."""
    from diffusers import DiffusionPipeline
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    diffusers_logging.disable_progress_bar()
    try:
        pipe = DiffusionPipeline.from_pretrained(str(folder))
    except (OSError, ValueError, KeyError, TypeError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise InputError(f"{folder}: cannot load the diffusers model ({first})") from None
    if (folder / LORA_DIR / LORA_FILE).is_file():
        pipe.load_lora_weights(str(folder / LORA_DIR))
        log.info("LoRA weights: %s", folder / LORA_DIR / LORA_FILE)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def draw(source: Path, options: DrawOptions, output: Path) -> dict[str, Any]:
    """One image for ``options.prompt`` written to ``output`` (PNG); what was drawn, as a dict."""
    import torch

    folder = model_folder(Path(source))
    if folder is None:
        raise InputError(
            f"{source}: no model_index.json here (--prompt draws with a text-to-image run or a "
            "diffusers model folder)"
        )
    if output.suffix.lower() != ".png":
        raise InputError(f"-o {output}: the image is written as PNG; name a .png file")
    if not output.parent.is_dir():
        raise InputError(f"-o {output}: {output.parent} is not a folder")
    pipe = load_pipeline(folder)
    scale = 2 ** (len(pipe.vae.config.block_out_channels) - 1)
    side = int(pipe.unet.config.sample_size) * scale
    height, width = options.height or side, options.width or side
    for name, value in (("--height", height), ("--width", width)):
        if value % scale:
            raise InputError(f"{name} {value}: must be a multiple of {scale} (the VAE's scale)")
    generator = torch.Generator("cpu").manual_seed(options.seed)
    image = pipe(
        options.prompt, negative_prompt=options.negative_prompt, height=height, width=width,
        num_inference_steps=options.steps, guidance_scale=options.guidance_scale,
        generator=generator,
    ).images[0]  # fmt: skip
    with fsutil.atomic_file(output, "wb") as fh:  # a reader never sees half a PNG
        image.save(fh, format="PNG")
    return {
        "image": str(output), "prompt": options.prompt, "negative_prompt": options.negative_prompt,
        "height": height, "width": width, "steps": options.steps,
        "guidance_scale": options.guidance_scale, "seed": options.seed,
        "scheduler": type(pipe.scheduler).__name__, "runtime": "pytorch",
    }  # fmt: skip
