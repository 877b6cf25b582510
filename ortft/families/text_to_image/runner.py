"""Drawing with a text-to-image export on onnxruntime, numpy and tokenizers alone: what diffusers'
``StableDiffusionPipeline.__call__`` does, with its scheduler's step in numpy.

This file imports nothing of ortft's: the export copies it into its folder as ``draw.py``, so a
deployment draws with the folder alone (``python draw.py --prompt "a photo" -o out.png``; Pillow
writes the PNG). ``ortft predict RUN/onnx --prompt`` draws with it too.

- **captions**: the prompt and the negative prompt (default: the empty one) padded to the
  tokenizer's length, through text_encoder.onnx (int32 ids): the guidance pair.
- **the loop**: the scheduler's timesteps; each step scales the latents as the scheduler does
  (Euler: / sqrt(sigma^2 + 1)), runs the UNet once on them twice over (unconditional,
  conditional), mixes ``uncond + g * (cond - uncond)`` (skipped at ``guidance_scale <= 1``),
  then the scheduler's step.
- **schedulers**: DDIM (eta 0), Euler discrete (no churn) and PNDM (PLMS, ``skip_prk_steps``:
  Stable Diffusion 1.x's own), each from the folder's scheduler_config.json, the way diffusers'
  ``from_config`` reads it; a setting this file does not reproduce is refused (``Unsupported``).
- **pixels**: vae_decoder.onnx of latents / scaling_factor, then (x / 2 + 0.5) clipped to [0, 1],
  x 255, rounded: uint8 [H, W, 3], as diffusers' image processor makes a PIL image.

The starting latents are given (numpy cannot draw torch's ``randn``), [1, C, h, w] with unit
variance; they are scaled by the scheduler's ``init_noise_sigma`` as diffusers' pipeline scales
the latents it is given. Every figure is float32, as diffusers computes it.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np


class Unsupported(ValueError):
    """A scheduler or setting this file does not reproduce."""


# --------------------------------------------------------------------------- the schedule


def alphas_cumprod(config: dict[str, Any]) -> np.ndarray:
    """The cumulative alphas of the config's betas, in diffusers' float32 arithmetic
    (torch.linspace in float32, then cumprod)."""
    n, kind = int(config.get("num_train_timesteps", 1000)), config.get("beta_schedule", "linear")
    start, end = float(config.get("beta_start", 0.0001)), float(config.get("beta_end", 0.02))
    if config.get("trained_betas") is not None:
        betas = np.asarray(config["trained_betas"], dtype=np.float32)
    elif kind == "linear":
        betas = np.linspace(start, end, n, dtype=np.float32)
    elif kind == "scaled_linear":
        betas = np.linspace(start**0.5, end**0.5, n, dtype=np.float32) ** 2
    elif kind == "squaredcos_cap_v2":  # diffusers' betas_for_alpha_bar, cosine, in float64

        def bar(t: float) -> float:
            return math.cos((t + 0.008) / 1.008 * math.pi / 2) ** 2

        betas = np.array(
            [min(1 - bar((i + 1) / n) / bar(i / n), 0.999) for i in range(n)], dtype=np.float32
        )
    else:
        raise Unsupported(f"scheduler: beta_schedule {kind!r} is not reproduced")
    if config.get("rescale_betas_zero_snr"):
        raise Unsupported("scheduler: rescale_betas_zero_snr is not reproduced")
    return np.cumprod(1.0 - betas, dtype=np.float32)


def spaced(config: dict[str, Any], steps: int, default: str) -> np.ndarray:
    """The ``steps`` timesteps of ``timestep_spacing``, rising, float64 (each scheduler rounds
    and orders them its own way)."""
    n, spacing = int(config.get("num_train_timesteps", 1000)), config.get("timestep_spacing")
    spacing = spacing or default
    if spacing == "linspace":
        return np.linspace(0, n - 1, steps)
    if spacing == "leading":
        return (np.arange(0, steps) * (n // steps)).round() + int(config.get("steps_offset", 0))
    if spacing == "trailing":
        return np.round(np.arange(n, 0, -n / steps))[::-1] - 1
    raise Unsupported(f"scheduler: timestep_spacing {spacing!r} is not reproduced")


def _prediction(config: dict[str, Any]) -> str:
    prediction = config.get("prediction_type", "epsilon")
    if prediction not in ("epsilon", "v_prediction"):
        raise Unsupported(f"scheduler: prediction_type {prediction!r} is not reproduced")
    return prediction


class DDIM:
    """diffusers' ``DDIMScheduler`` with eta 0 (no clipping, no thresholding)."""

    name, init_noise_sigma = "DDIMScheduler", 1.0

    def __init__(self, config: dict[str, Any]):
        if config.get("clip_sample") or config.get("thresholding"):
            raise Unsupported("scheduler: clip_sample / thresholding are not reproduced")
        self.config, self.prediction = config, _prediction(config)
        self.alphas = alphas_cumprod(config)
        self.final = np.float32(1.0) if config.get("set_alpha_to_one", True) else self.alphas[0]
        self.ratio, self.steps = 1, np.zeros(0, np.int64)

    def timesteps(self, steps: int) -> np.ndarray:
        self.ratio = int(self.config.get("num_train_timesteps", 1000)) // steps
        self.steps = spaced(self.config, steps, "leading").round()[::-1].astype(np.int64)
        return self.steps

    def scale(self, x: np.ndarray, i: int) -> np.ndarray:
        return x

    def step(self, out: np.ndarray, i: int, x: np.ndarray) -> np.ndarray:
        t = int(self.steps[i])
        a_t, prev = self.alphas[t], t - self.ratio
        a_prev = self.alphas[prev] if prev >= 0 else self.final
        b_t = 1.0 - a_t
        if self.prediction == "epsilon":
            x0, eps = (x - np.sqrt(b_t) * out) / np.sqrt(a_t), out
        else:
            x0, eps = np.sqrt(a_t) * x - np.sqrt(b_t) * out, np.sqrt(a_t) * out + np.sqrt(b_t) * x
        return (np.sqrt(a_prev) * x0 + np.sqrt(1.0 - a_prev) * eps).astype(np.float32)


class EulerDiscrete:
    """diffusers' ``EulerDiscreteScheduler`` without churn (its default): sigmas interpolated
    linearly over the timesteps, the last one 0 (or sigma_min)."""

    name = "EulerDiscreteScheduler"

    def __init__(self, config: dict[str, Any]):
        for key in ("use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas"):
            if config.get(key):
                raise Unsupported(f"scheduler: {key} is not reproduced")
        if config.get("interpolation_type", "linear") != "linear":
            raise Unsupported(f"scheduler: interpolation_type {config['interpolation_type']!r}")
        if config.get("timestep_type", "discrete") != "discrete":
            raise Unsupported(f"scheduler: timestep_type {config['timestep_type']!r}")
        self.config, self.prediction = config, _prediction(config)
        alphas = alphas_cumprod(config)
        self.all_sigmas = ((1 - alphas) / alphas) ** 0.5
        self.sigmas, self.init_noise_sigma = self.all_sigmas, 1.0

    def timesteps(self, steps: int) -> np.ndarray:
        t = spaced(self.config, steps, "linspace")[::-1].astype(np.float32)
        sigmas = np.interp(t, np.arange(0, len(self.all_sigmas)), self.all_sigmas)
        last = 0.0
        if self.config.get("final_sigmas_type", "zero") == "sigma_min":
            last = float(self.all_sigmas[0])
        self.sigmas = np.concatenate([sigmas, [last]]).astype(np.float32)
        top = self.sigmas.max()
        spacing = self.config.get("timestep_spacing") or "linspace"
        self.init_noise_sigma = top if spacing in ("linspace", "trailing") else (top**2 + 1) ** 0.5
        return t

    def scale(self, x: np.ndarray, i: int) -> np.ndarray:
        return x / ((self.sigmas[i] ** 2 + 1) ** 0.5)

    def step(self, out: np.ndarray, i: int, x: np.ndarray) -> np.ndarray:
        sigma = self.sigmas[i]
        if self.prediction == "epsilon":
            x0 = x - sigma * out
        else:
            x0 = out * (-sigma / (sigma**2 + 1) ** 0.5) + (x / (sigma**2 + 1))
        return (x + (x - x0) / sigma * (self.sigmas[i + 1] - sigma)).astype(np.float32)


class PNDM:
    """diffusers' ``PNDMScheduler`` with ``skip_prk_steps`` (PLMS: a linear multistep over the
    last four model outputs; the second timestep is run twice): Stable Diffusion 1.x's."""

    name, init_noise_sigma = "PNDMScheduler", 1.0

    def __init__(self, config: dict[str, Any]):
        if not config.get("skip_prk_steps", False):
            raise Unsupported("scheduler: PNDM's Runge-Kutta steps (skip_prk_steps false)")
        self.config, self.prediction = config, _prediction(config)
        self.alphas = alphas_cumprod(config)
        self.final = np.float32(1.0) if config.get("set_alpha_to_one", False) else self.alphas[0]
        self.ets: list[np.ndarray] = []
        self.cur: np.ndarray | None = None
        self.ratio, self.steps, self.counter = 1, np.zeros(0), 0

    def timesteps(self, steps: int) -> np.ndarray:
        self.ratio = int(self.config.get("num_train_timesteps", 1000)) // steps
        t = spaced(self.config, steps, "leading").round().astype(np.int64)
        self.steps = np.concatenate([t[:-1], t[-2:-1], t[-1:]])[::-1].astype(np.int64)
        self.ets, self.counter, self.cur = [], 0, None
        return self.steps

    def scale(self, x: np.ndarray, i: int) -> np.ndarray:
        return x

    def step(self, out: np.ndarray, i: int, x: np.ndarray) -> np.ndarray:
        t = int(self.steps[i])
        prev = t - self.ratio
        if self.counter != 1:
            self.ets = [*self.ets[-3:], out]
        else:
            prev, t = t, t + self.ratio
        e = self.ets
        if len(e) == 1 and self.counter == 0:
            self.cur = x
        elif len(e) == 1 and self.counter == 1:
            out, x, self.cur = (out + e[-1]) / 2, self.cur, None  # type: ignore[assignment]
        elif len(e) == 2:
            out = (3 * e[-1] - e[-2]) / 2
        elif len(e) == 3:
            out = (23 * e[-1] - 16 * e[-2] + 5 * e[-3]) / 12
        else:
            out = (1 / 24) * (55 * e[-1] - 59 * e[-2] + 37 * e[-3] - 9 * e[-4])
        self.counter += 1
        return self._previous(x, t, prev, out)

    def _previous(self, x: np.ndarray, t: int, prev: int, out: np.ndarray) -> np.ndarray:
        a_t = self.alphas[t]
        a_prev = self.alphas[prev] if prev >= 0 else self.final
        b_t, b_prev = 1 - a_t, 1 - a_prev
        if self.prediction == "v_prediction":
            out = (a_t**0.5) * out + (b_t**0.5) * x
        denominator = a_t * b_prev**0.5 + (a_t * b_t * a_prev) ** 0.5
        return ((a_prev / a_t) ** 0.5 * x - (a_prev - a_t) * out / denominator).astype(np.float32)


SCHEDULERS = {"DDIMScheduler": DDIM, "EulerDiscreteScheduler": EulerDiscrete, "PNDMScheduler": PNDM}
NAMES = {"ddim": "DDIMScheduler", "euler": "EulerDiscreteScheduler", "pndm": "PNDMScheduler"}
# a scheduler swapped in by name: PNDM as Stable Diffusion 1.x configures it (its default runs
# Runge-Kutta warm-up steps this file does not reproduce); diffusers' from_config takes the same
SWAP_OVERRIDES = {"pndm": {"skip_prk_steps": True}}


def scheduler(config: dict[str, Any], name: str | None = None) -> Any:
    """The numpy scheduler for ``config`` (a scheduler_config.json): its own class, or the one
    ``name`` picks (ddim, euler, pndm) read from the same config, as diffusers'
    ``Scheduler.from_config(pipe.scheduler.config)`` swaps one in."""
    cls = NAMES.get(name, name) if name else config.get("_class_name", "DDIMScheduler")
    if cls not in SCHEDULERS:
        known = ", ".join(NAMES)
        raise Unsupported(f"scheduler {cls}: not reproduced in numpy (choose one of {known})")
    return SCHEDULERS[cls]({**config, **SWAP_OVERRIDES.get(name or "", {})})


# --------------------------------------------------------------------------- the pipeline


class OnnxStableDiffusion:
    """The graphs of an export folder, drawing as diffusers' pipeline draws; ``scheduler_name``:
    the folder's own scheduler (None), or ddim, euler or pndm read from its config."""

    def __init__(self, folder: Path | str, scheduler_name: str | None = None):
        import onnxruntime as ort
        from tokenizers import Tokenizer

        folder = Path(folder)

        def session(name: str) -> Any:
            return ort.InferenceSession(
                str(folder / name / "model.onnx"), providers=["CPUExecutionProvider"]
            )

        self.text_encoder, self.unet = session("text_encoder"), session("unet")
        self.vae_decoder = session("vae_decoder")
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer" / "tokenizer.json"))
        tok_config = _json(folder / "tokenizer" / "tokenizer_config.json")
        self.max_length = int(tok_config.get("model_max_length", 77))
        self.pad_id = self.tokenizer.token_to_id(tok_config.get("pad_token", "<|endoftext|>"))
        config = _json(folder / "scheduler" / "scheduler_config.json")
        self.scheduler = scheduler(config, scheduler_name)
        self.unet_config = _json(folder / "unet" / "config.json")
        vae = _json(folder / "vae_decoder" / "config.json")
        self.scaling = float(vae.get("scaling_factor", 0.18215))
        self.vae_scale = 2 ** (len(vae.get("block_out_channels", [0] * 4)) - 1)
        timestep = next(i for i in self.unet.get_inputs() if i.name == "timestep")
        self.timestep_dtype = np.float32 if "float" in timestep.type else np.int64

    def latent_shape(self, height: int | None = None, width: int | None = None) -> tuple:
        """[1, C, h, w] of an image ``height`` x ``width`` pixels (default: the model's)."""
        side = int(self.unet_config["sample_size"]) * self.vae_scale
        height, width = height or side, width or side
        for name, value in (("height", height), ("width", width)):
            if value % self.vae_scale:
                raise ValueError(f"{name} {value}: not a multiple of {self.vae_scale}")
        s = self.vae_scale
        return (1, int(self.unet_config["in_channels"]), height // s, width // s)

    def ids(self, text: str) -> np.ndarray:
        """Padded to the tokenizer's length with its pad token, cut there (what the CLIP
        tokenizer does with padding="max_length", truncation=True)."""
        ids = self.tokenizer.encode(text).ids[: self.max_length]
        return np.array(ids + [self.pad_id] * (self.max_length - len(ids)), dtype=np.int32)

    def encode(self, prompt: str, negative: str | None) -> np.ndarray:
        ids = np.stack([self.ids(negative or ""), self.ids(prompt)])
        return self.text_encoder.run(None, {"input_ids": ids})[0]

    def draw(
        self,
        prompt: str,
        latents: np.ndarray,
        steps: int = 20,
        guidance_scale: float = 7.5,
        negative_prompt: str | None = None,
    ) -> np.ndarray:
        """uint8 [H, W, 3] from the starting ``latents`` [1, C, h, w] (unit variance)."""
        hidden = self.encode(prompt, negative_prompt)
        guided = guidance_scale > 1.0
        if not guided:
            hidden = hidden[1:]
        sched = self.scheduler
        timesteps = sched.timesteps(steps)
        x = latents.astype(np.float32) * np.float32(sched.init_noise_sigma)
        for i, t in enumerate(timesteps):
            sample = sched.scale(np.concatenate([x, x]) if guided else x, i)
            feeds = {
                "sample": sample,
                "timestep": np.array([t], dtype=self.timestep_dtype),
                "encoder_hidden_states": hidden,
            }
            out = self.unet.run(None, feeds)[0]
            if guided:
                out = out[:1] + guidance_scale * (out[1:] - out[:1])
            x = sched.step(out, i, x)
        image = self.vae_decoder.run(None, {"latent_sample": x / self.scaling})[0][0]
        pixels = np.clip(image / 2 + 0.5, 0.0, 1.0).transpose(1, 2, 0)
        return (pixels * 255).round().astype(np.uint8)


def _json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def seeded_latents(shape: tuple, seed: int) -> np.ndarray:
    """The starting latents of ``--seed``: numpy's generator (torch's randn is another stream:
    the same seed draws another image than diffusers' PyTorch pipeline)."""
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def main(argv: list[str] | None = None) -> int:
    """``python draw.py --prompt TEXT -o out.png``: one image from this folder's graphs."""
    here = Path(__file__).resolve().parent
    p = argparse.ArgumentParser(prog="draw.py", description=main.__doc__)
    p.add_argument("--prompt", required=True)
    p.add_argument("--negative-prompt")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--guidance-scale", type=float, default=7.5)
    p.add_argument("--seed", type=int, default=0, help="numpy's generator draws the latents")
    p.add_argument("--latents", type=Path, help="starting latents, a .npy [1, C, h, w]")
    p.add_argument("--height", type=int)
    p.add_argument("--width", type=int)
    p.add_argument("--scheduler", choices=sorted(NAMES), help="default: the folder's")
    p.add_argument("--folder", type=Path, default=here, help="the export (default: this file's)")
    p.add_argument("-o", "--output", type=Path, help="a PNG (Pillow), or .npy: uint8 [H, W, 3]")
    args = p.parse_args(argv)
    try:
        pipe = OnnxStableDiffusion(args.folder, args.scheduler)
        if args.latents is not None:
            latents = np.load(args.latents)
        else:
            latents = seeded_latents(pipe.latent_shape(args.height, args.width), args.seed)
        pixels = pipe.draw(
            args.prompt, latents, args.steps, args.guidance_scale, args.negative_prompt
        )
    except (ValueError, OSError) as err:
        print(f"draw.py: {err}", file=sys.stderr)
        return 2
    out = args.output or Path("out.png")
    if out.suffix == ".npy":
        np.save(out, pixels)
    else:
        from PIL import Image

        Image.fromarray(pixels).save(out)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
