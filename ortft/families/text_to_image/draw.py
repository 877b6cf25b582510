"""``ortft predict RUN --prompt "..." -o out.png``: draw with a text-to-image run's model.

The run's ``final/`` is a diffusers Stable Diffusion folder; a LoRA run's holds the base model and
its LoRA weights in ``final/lora/``, loaded on top (``pipe.load_lora_weights``). Drawing is
diffusers' own ``StableDiffusionPipeline`` in PyTorch, with the scheduler saved in the folder,
seeded by ``--seed`` (a ``torch.Generator`` on the CPU: the same seed draws the same image).
The run's ONNX export (``<run>/onnx``: text_encoder, unet, vae_decoder) draws with onnxruntime
and numpy alone (``runner``, the export's draw.py), from latents numpy's
generator draws. ``--scheduler ddim|euler|pndm`` swaps the folder's scheduler for another read
from the same config, in either runtime (diffusers' ``from_config``; the numpy one's twin).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ortft.core import fsutil
from ortft.core.errors import InputError
from ortft.core.reports import Drawing
from ortft.families.text_to_image import graphs as diffusion


@dataclass(frozen=True)
class DrawOptions:
    prompt: str
    negative_prompt: str | None = None
    guidance_scale: float = 7.5
    height: int | None = None  # default: the UNet's sample size x the VAE's scale
    width: int | None = None
    steps: int = 20
    seed: int = 0
    scheduler: str | None = None  # ddim, euler, pndm (runner.NAMES); None: the folder's


def model_folder(source: Path) -> tuple[Path, str] | None:
    """The folder ``source`` draws with and its runtime: an ONNX export (``unet/model.onnx``:
    onnxruntime), else a diffusers folder (a run's final/ or a model folder: pytorch)."""
    if (source / "unet" / "model.onnx").is_file():
        return source, "onnxruntime"
    for folder in (source / "final", source):
        if (folder / "model_index.json").is_file():
            return folder, "pytorch"
    return None


def _size(options: DrawOptions, sample_size: int, scale: int) -> tuple[int, int]:
    side = sample_size * scale
    height, width = options.height or side, options.width or side
    for name, value in (("--height", height), ("--width", width)):
        if value % scale:
            raise InputError(f"{name} {value}: must be a multiple of {scale} (the VAE's scale)")
    return height, width


def draw(source: Path, options: DrawOptions, output: Path) -> Drawing:
    """One image for ``options.prompt`` written to ``output`` (PNG); what was drawn, as a dict."""
    found = model_folder(Path(source))
    if found is None:
        raise InputError(
            f"{source}: no model_index.json or unet/model.onnx here (--prompt draws with a "
            "text-to-image run, its ONNX export or a diffusers model folder)"
        )
    if output.suffix.lower() != ".png":
        raise InputError(f"-o {output}: the image is written as PNG; name a .png file")
    if not output.parent.is_dir():
        raise InputError(f"-o {output}: {output.parent} is not a folder")
    folder, runtime = found
    draw_with = _draw_onnx if runtime == "onnxruntime" else _draw_torch
    image, height, width, scheduler = draw_with(folder, options)
    with fsutil.atomic_file(output, "wb") as fh:  # a reader never sees half a PNG
        image.save(fh, format="PNG")
    return {
        "image": str(output),
        "prompt": options.prompt,
        "negative_prompt": options.negative_prompt,
        "height": height,
        "width": width,
        "steps": options.steps,
        "guidance_scale": options.guidance_scale,
        "seed": options.seed,
        "scheduler": scheduler,
        "runtime": runtime,
    }


def _draw_torch(folder: Path, options: DrawOptions) -> tuple[Any, int, int, str]:
    import torch

    pipe = diffusion.load_pipeline(folder)
    if options.scheduler is not None:
        import diffusers

        from ortft.families.text_to_image.runner import NAMES, SWAP_OVERRIDES

        cls = getattr(diffusers, NAMES[options.scheduler])
        extra = SWAP_OVERRIDES.get(options.scheduler, {})
        pipe.scheduler = cls.from_config(pipe.scheduler.config, **extra)
    scale = 2 ** (len(pipe.vae.config.block_out_channels) - 1)
    height, width = _size(options, int(pipe.unet.config.sample_size), scale)
    generator = torch.Generator("cpu").manual_seed(options.seed)
    image = pipe(
        options.prompt,
        negative_prompt=options.negative_prompt,
        height=height,
        width=width,
        num_inference_steps=options.steps,
        guidance_scale=options.guidance_scale,
        generator=generator,
    ).images[0]
    return image, height, width, type(pipe.scheduler).__name__


def _draw_onnx(folder: Path, options: DrawOptions) -> tuple[Any, int, int, str]:
    """The export's graphs and the numpy loop; the starting latents from numpy's generator
    seeded by --seed (not torch's randn: the same seed draws another image than PyTorch
    does)."""
    from PIL import Image

    from ortft.families.text_to_image import runner

    try:
        pipe = runner.OnnxStableDiffusion(folder, options.scheduler)
    except runner.Unsupported as err:
        raise InputError(f"{folder}: {err} (--scheduler ddim, euler or pndm draws)") from None
    scale = pipe.vae_scale
    height, width = _size(options, int(pipe.unet_config["sample_size"]), scale)
    latents = runner.seeded_latents(pipe.latent_shape(height, width), options.seed)
    pixels = pipe.draw(
        options.prompt, latents, options.steps, options.guidance_scale, options.negative_prompt
    )
    return Image.fromarray(pixels), height, width, pipe.scheduler.name
