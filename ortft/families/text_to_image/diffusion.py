"""Stable Diffusion's parts for text-to-image (diffusers): what the engine gets from the family
(``family.StableDiffusion.build_model``) where a text task builds one transformers model.

A diffusers model folder (``model_index.json``, ``unet/``, ``vae/``, ``text_encoder/``,
``tokenizer/``, ``scheduler/``) holds five parts. Only the UNet trains: it is what the backend
wraps (ORTModule on ``ort``). The VAE and the text encoder are frozen and run in PyTorch under
``no_grad`` when a batch is collated (``Frozen``): the task turns a batch's pixels and caption ids
into latents and hidden states there, so ORT's graph is the UNet and its loss alone.

A model built ``from_config`` (tests, the offline recipe) is a tiny Stable Diffusion:
- a CLIP text encoder of ``hidden_size`` x ``num_layers`` (``num_heads`` heads), which is also the
  UNet's cross-attention width;
- a UNet of two blocks (``options.unet_channels`` and twice that; the second has cross-attention),
  ``options.layers_per_block`` each;
- a VAE of two blocks (``options.vae_channels``, twice that): latents at half the resolution,
  ``options.latent_channels`` deep;
- a character-level CLIP tokenizer (no merges: every character is a token, a word's last one
  marked ``</w>`` as CLIP marks it), so nothing has to be trained or downloaded;
- DDPM's scaled-linear schedule of Stable Diffusion 1.x (betas 0.00085 to 0.012, 1000 steps),
  saved as a DDIM scheduler for drawing.

Over 450 lines: a diffusers folder's parts (frozen encoders, the trained UNet) and the tiny
from_config builder of the same parts, read together.
"""

from __future__ import annotations

import copy
import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ortft.backends.torch import distributed, load_checks, models
from ortft.core.errors import InputError, first_line
from ortft.families.text_to_image import graphs as sd_export  # final/lora/: its LoRA's folder
from ortft.recipe.io import LoadedRecipe
from ortft.recipe.model import FromConfig

log = logging.getLogger("ortft")

PARTS = ("unet", "vae", "text_encoder", "tokenizer", "scheduler")
BOS, EOS = "<|startoftext|>", "<|endoftext|>"
# the attention projections LoRA adapts in diffusers' own train_text_to_image_lora.py
LORA_TARGETS = ["to_k", "to_q", "to_v", "to_out.0"]
# tiny from_config defaults (the sizes of diffusers' own test models, widened to train on 2 cores)
TINY = {"unet_channels": 32, "layers_per_block": 1, "vae_channels": 32, "latent_channels": 4}
SD_SCHEDULE = {
    "num_train_timesteps": 1000,
    "beta_start": 0.00085,
    "beta_end": 0.012,
    "beta_schedule": "scaled_linear",
    "clip_sample": False,
}


@dataclass
class Parts:
    """A Stable Diffusion's parts; ``unet`` is the one that trains."""

    unet: Any
    vae: Any
    text_encoder: Any
    tokenizer: Any
    scheduler: Any


def is_folder(path: Path) -> bool:
    return (path / "model_index.json").is_file()


def check_folder(path: Path, field: str = "model.name_or_path") -> None:
    """One line naming what a diffusers model folder lacks."""
    if not path.is_dir():
        raise InputError(f"{field}: {path} is not a folder")
    if not is_folder(path):
        raise InputError(
            f"{field}: {path} has no model_index.json (text-to-image needs a diffusers model "
            "folder: model_index.json, unet/, vae/, text_encoder/, tokenizer/, scheduler/)"
        )
    missing = [p for p in PARTS if not (path / p).is_dir()]
    if missing:
        raise InputError(f"{field}: {path} has no {', '.join(p + '/' for p in missing)}")


# --------------------------------------------------------------------------- the tokenizer


def byte_symbols() -> list[str]:
    """GPT-2's and CLIP's byte-level alphabet: one printable character per byte value (the
    printable Latin-1 bytes stand for themselves, the others for 256 + their rank)."""
    keep = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    extra = iter(range(256, 512))
    return [chr(b) if b in keep else chr(next(extra)) for b in range(256)]


def char_tokenizer(folder: Path, max_length: int) -> Any:
    """A CLIP tokenizer with no merges, written to ``folder`` and loaded from it: the 256 byte
    symbols of CLIP's byte-level alphabet, each also as a word's last character (``</w>``),
    then start and end of text (end of text pads, as in Stable Diffusion 1.x)."""
    from transformers import CLIPTokenizer

    symbols = byte_symbols()
    vocab = {s: i for i, s in enumerate([*symbols, *(s + "</w>" for s in symbols), BOS, EOS])}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    tok = CLIPTokenizer(
        str(folder / "vocab.json"),
        str(folder / "merges.txt"),
        pad_token=EOS,
        model_max_length=max_length,
    )
    tok.save_pretrained(folder)
    return load_tokenizer(folder)


def load_tokenizer(folder: Path) -> Any:
    """The CLIP tokenizer saved in ``folder``; one line if it is not a real one (transformers 5
    builds a 5-token tokenizer from a folder without tokenizer files, without an error)."""
    from transformers import CLIPTokenizer

    if not (folder / "vocab.json").is_file() and not (folder / "tokenizer.json").is_file():
        raise InputError(f"{folder}: no tokenizer files (vocab.json + merges.txt)")
    try:
        tok = CLIPTokenizer.from_pretrained(str(folder))
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise InputError(f"{folder}: cannot load the tokenizer ({first_line(err)})") from None
    if len(tok) <= 5:
        raise InputError(f"{folder}: the tokenizer has only {len(tok)} tokens")
    return tok


def tokenizer(source: Path | None, saved: Path, max_length: int) -> Any:
    """The run's tokenizer: saved in the run (a resumed run), the folder's ``tokenizer/``, or
    for a from_config model the character tokenizer; saved as the run's ``tokenizer/``."""
    if (saved / "vocab.json").is_file() or (saved / "tokenizer.json").is_file():
        return load_tokenizer(saved)
    if source is None:
        return char_tokenizer(saved, max_length)
    tok = load_tokenizer(source / "tokenizer")
    tok.save_pretrained(saved)
    return tok


def run_tokenizer(loaded: LoadedRecipe, run_dir: Path) -> Any:
    """The model folder's ``tokenizer/``, or a from_config model's character tokenizer; rank 0
    saves it as the run's ``tokenizer/``, the others load it."""
    spec = loaded.recipe.model
    source = None
    if spec.name_or_path:
        source = Path(models.model_source(loaded, spec.name_or_path))
        check_folder(source)
    # CLIP's 77 positions (from_config: its max_position_embeddings, at most 77)
    max_length = min(spec.from_config.max_position_embeddings, 77) if spec.from_config else 77
    if not distributed.is_main():
        distributed.barrier()
    tok = tokenizer(source, run_dir / "tokenizer", max_length)
    if distributed.is_main():
        distributed.barrier()
    return tok


# --------------------------------------------------------------------------- building the parts


def build(loaded: LoadedRecipe, task: Any, tok: Any, device: torch.device) -> tuple[Parts, Any]:
    """The parts and the UNet as it trains (LoRA on its attention with ``adapter:``); the frozen
    VAE and text encoder, the schedule and the prediction type go to the task (``bind_frozen``),
    which runs them in collate."""
    r, o = loaded.recipe, task.options
    if r.model.from_config:
        prediction = o.prediction_type or "epsilon"
        parts = tiny(r.model.from_config, tok, o.resolution, r.training.seed, prediction)
    else:
        parts = load(Path(models.model_source(loaded, r.model.name_or_path or "")), tok)
    asked = o.prediction_type  # final/'s scheduler must draw what the UNet learned to predict
    if asked and parts.scheduler.config.get("prediction_type") != asked:
        parts.scheduler = type(parts.scheduler).from_config(
            parts.scheduler.config, prediction_type=asked
        )
    unet = prepare_unet(parts.unet, r.adapter)
    if r.hardware.gradient_checkpointing:
        unet.enable_gradient_checkpointing()
    if r.backend.trainable:
        models.freeze(unet, r.backend.trainable)
    task.bind_frozen(
        Frozen(parts, device),
        alphas_cumprod(parts.scheduler),
        parts.scheduler.config.get("prediction_type", "epsilon"),
        unet,
    )
    log.info(
        "model: Stable Diffusion UNet, %d of %d parameters train (%s); VAE and text encoder "
        "frozen, in PyTorch",
        models.count_parameters(unet, trainable=True),
        models.count_parameters(unet),
        r.adapter.kind if r.adapter is not None else "full",
    )
    return parts, unet


def tiny(spec: FromConfig, tok: Any, resolution: int, seed: int, prediction: str) -> Parts:
    """A Stable Diffusion built from ``spec`` (see the module docstring), seeded."""
    from diffusers import AutoencoderKL, DDIMScheduler, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    o = {**TINY, **spec.options}
    unknown = sorted(set(o) - set(TINY))
    if unknown:
        raise InputError(
            f"model.from_config.options: {', '.join(unknown)} is not a tiny Stable Diffusion "
            f"size (those are: {', '.join(TINY)})"
        )
    bad = [k for k, n in o.items() if isinstance(n, bool) or not isinstance(n, int) or n < 1]
    if bad:
        raise InputError(f"model.from_config.options: {', '.join(bad)} must be whole numbers >= 1")
    c, v, lat = int(o["unet_channels"]), int(o["vae_channels"]), int(o["latent_channels"])
    groups = math.gcd(8, c, v)  # GroupNorm's groups divide every block's channels (c, 2c, v, 2v)
    heads = math.gcd(max(c // 8, 1), 2 * c)  # diffusers' attention_head_dim: heads per block
    torch.manual_seed(seed)
    text = CLIPTextModel(
        CLIPTextConfig(
            vocab_size=len(tok),
            hidden_size=spec.hidden_size,
            num_hidden_layers=spec.num_layers,
            num_attention_heads=spec.num_heads,
            intermediate_size=spec.intermediate_size or 4 * spec.hidden_size,
            max_position_embeddings=tok.model_max_length,
            bos_token_id=tok.bos_token_id,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        )
    )
    vae = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        latent_channels=lat,
        block_out_channels=(v, 2 * v),
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        layers_per_block=1,
        norm_num_groups=groups,
        sample_size=resolution,
    )
    unet = UNet2DConditionModel(
        sample_size=resolution // 2,
        in_channels=lat,
        out_channels=lat,
        layers_per_block=int(o["layers_per_block"]),
        block_out_channels=(c, 2 * c),
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=spec.hidden_size,
        attention_head_dim=heads,
        norm_num_groups=groups,
    )
    scheduler = DDIMScheduler(
        **SD_SCHEDULE, set_alpha_to_one=False, steps_offset=1, prediction_type=prediction
    )
    return Parts(unet, vae, text, tok, scheduler)


def load(folder: Path, tok: Any, field: str = "model.name_or_path") -> Parts:
    """The parts of a diffusers model folder (weights as saved; fp32)."""
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextModel

    check_folder(folder, field)
    errors: tuple[type[BaseException], ...] = (
        OSError,
        ValueError,
        KeyError,
        TypeError,
        RuntimeError,
        *load_checks.load_errors(),
    )
    try:
        unet = UNet2DConditionModel.from_pretrained(str(folder), subfolder="unet")
        vae = AutoencoderKL.from_pretrained(str(folder), subfolder="vae")
        text = CLIPTextModel.from_pretrained(str(folder), subfolder="text_encoder")
        scheduler = _scheduler(folder / "scheduler")
    except errors as err:
        raise InputError(f"{field}: {folder}: cannot load the model ({first_line(err)})") from None
    return Parts(unet.float(), vae.float(), text.float(), tok, scheduler)


def _scheduler(folder: Path) -> Any:
    """The folder's scheduler, by the class its config names (DDIM if diffusers lacks it)."""
    import diffusers

    config = json.loads((folder / "scheduler_config.json").read_text())
    cls = getattr(diffusers, str(config.get("_class_name", "")), None) or diffusers.DDIMScheduler
    return cls.from_config(config)


def prepare_unet(unet: Any, adapter: Any) -> Any:
    """The UNet as it trains: plain attention processors (ORTModule's CPU graph cannot take
    sdpa's fused kernel; the plain one is matmul + softmax), and LoRA on the attention
    projections when the recipe has an adapter (peft, as diffusers' LoRA script adds it)."""
    from diffusers.models.attention_processor import AttnProcessor

    unet.set_attn_processor(AttnProcessor())
    if adapter is None:
        unet.requires_grad_(True)
        return unet
    try:
        from peft import LoraConfig
    except ImportError as err:
        raise InputError(
            f"adapter.kind={adapter.kind} needs peft ({err}); pip install peft"
        ) from None
    targets = adapter.target_modules or LORA_TARGETS
    names = {n for n, _ in unet.named_modules()}
    missing = [t for t in targets if not any(n.endswith("." + t) for n in names)]
    if missing:
        raise InputError(
            f"adapter.target_modules: {', '.join(missing)} matches no module of the UNet "
            f"(diffusers' LoRA adapts {', '.join(LORA_TARGETS)})"
        )
    unet.requires_grad_(False)
    unet.add_adapter(
        LoraConfig(
            r=adapter.rank,
            lora_alpha=adapter.alpha,
            lora_dropout=adapter.dropout,
            init_lora_weights="gaussian",
            target_modules=list(targets),
            use_dora=adapter.kind == "dora",  # diffusers' loader reads it from the magnitudes
        )
    )
    return unet


# --------------------------------------------------------------------------- the frozen parts


class Frozen:
    """The frozen VAE encoder and text encoder, called by the task's collate (numpy in, numpy
    out): PyTorch under no_grad, fp32, on the run's device."""

    def __init__(self, parts: Parts, device: torch.device):
        self.vae = parts.vae.to(device).eval().requires_grad_(False)
        self.text_encoder = parts.text_encoder.to(device).eval().requires_grad_(False)
        self.device = device
        self.scaling_factor = float(parts.vae.config.scaling_factor)

    @torch.no_grad()
    def latent_moments(self, pixels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The VAE's latent mean and standard deviation of ``pixels`` ([B, 3, H, W] in [-1, 1]),
        each already multiplied by the scaling factor (a latent is ``mean + std * noise``)."""
        dist = self.vae.encode(torch.from_numpy(pixels).to(self.device)).latent_dist
        s = self.scaling_factor
        return (dist.mean * s).cpu().numpy(), (dist.std * s).cpu().numpy()

    @torch.no_grad()
    def hidden_states(self, input_ids: np.ndarray) -> np.ndarray:
        """The text encoder's last hidden states of caption ids [B, L]: what the UNet attends to."""
        out = self.text_encoder(torch.from_numpy(input_ids).to(self.device))
        return out[0].float().cpu().numpy()


def alphas_cumprod(scheduler: Any) -> np.ndarray:
    """The training schedule's cumulative alphas (DDPM's, from the folder's scheduler config)."""
    from diffusers import DDPMScheduler

    config = {k: v for k, v in scheduler.config.items() if not k.startswith("_")}
    return DDPMScheduler.from_config(config).alphas_cumprod.numpy().astype(np.float64)


# --------------------------------------------------------------------------- final/


def base_unet(unet: Any) -> Any:
    """A plain copy of a LoRA UNet without its adapter: the frozen base weights."""
    from diffusers import UNet2DConditionModel

    plain = UNet2DConditionModel.from_config(unet.config)
    state = {
        k.replace(".base_layer.", "."): v for k, v in unet.state_dict().items() if ".lora_" not in k
    }
    plain.load_state_dict(state)
    return plain


def save_final(folder: Path, unet: Any, parts: Parts, ema: Any = None) -> None:
    """final/ as a diffusers Stable Diffusion folder ``StableDiffusionPipeline.from_pretrained``
    loads; with ``ema`` (diffusers' EMAModel) the UNet's averaged weights, as diffusers' script
    saves them. A LoRA run's holds the base UNet and, in ``lora/``, the UNet's LoRA weights in
    diffusers' format (``pipe.load_lora_weights(final / "lora")``)."""
    from diffusers import StableDiffusionPipeline
    from diffusers.models.attention_processor import AttnProcessor2_0

    lora = hasattr(unet, "peft_config")
    plain = base_unet(unet) if lora else copy.deepcopy(unet)
    if ema is not None:  # the same parameters in the same order: a full run's UNet copy
        ema.copy_to([p for p in plain.parameters() if p.requires_grad])
    plain.set_attn_processor(AttnProcessor2_0())  # drawing: diffusers' default (sdpa)
    pipe: Any = StableDiffusionPipeline(
        vae=parts.vae,
        text_encoder=parts.text_encoder,
        tokenizer=parts.tokenizer,
        unet=plain.to("cpu"),
        scheduler=parts.scheduler,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    pipe.save_pretrained(str(folder))
    if lora:
        from diffusers.utils import convert_state_dict_to_diffusers
        from peft.utils import get_peft_model_state_dict

        layers = convert_state_dict_to_diffusers(get_peft_model_state_dict(unet))
        # the adapter's config in the file's metadata, as diffusers' own LoRA scripts save it:
        # without it load_lora_weights takes lora_alpha = rank (alpha 16 of rank 4 drew with
        # a quarter of the trained LoRA; the UNet's output moved by up to 0.66)
        StableDiffusionPipeline.save_lora_weights(
            str(folder / sd_export.LORA_DIR),
            unet_lora_layers=layers,
            safe_serialization=True,
            unet_lora_adapter_metadata=unet.peft_config["default"].to_dict(),
        )


def draw_validation(parts: Parts, unet: Any, task: Any, folder: Path, seed: int) -> int:
    """Each of the task's validation prompts drawn with the UNet as it is (the task's EMA
    weights where it keeps them, then put back), the frozen parts and the model's scheduler,
    ``task.validation_steps`` steps, one PNG each (``folder``/00.png, ...), written as a whole
    folder; the number drawn (0 without prompts). Prompt i starts from ``seed + i``."""
    prompts, ema, steps = task.validation_prompts, task.ema, task.options.validation_steps
    if not prompts:
        return 0
    from diffusers import StableDiffusionPipeline

    from ortft.core import fsutil

    trained = [p for p in unet.parameters() if p.requires_grad]
    if ema is not None:  # as diffusers' script validates: the EMA weights, then the live ones
        ema.store(trained)
        ema.copy_to(trained)
    was_training = unet.training
    pipe: Any = StableDiffusionPipeline(
        vae=parts.vae,
        text_encoder=parts.text_encoder,
        tokenizer=parts.tokenizer,
        unet=unet.eval(),
        scheduler=copy.deepcopy(parts.scheduler),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    pipe.set_progress_bar_config(disable=True)
    try:
        with torch.no_grad(), fsutil.atomic_dir(folder) as tmp:
            for i, prompt in enumerate(prompts):
                generator = torch.Generator("cpu").manual_seed(seed + i)
                image = pipe(prompt, num_inference_steps=steps, generator=generator).images[0]
                image.save(tmp / f"{i:02d}.png")
    finally:
        unet.train(was_training)
        if ema is not None:
            ema.restore(trained)
    return len(prompts)
