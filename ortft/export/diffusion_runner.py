"""Drawing with a text-to-image export (``ortft.export.diffusion``) on onnxruntime and numpy
alone: what diffusers' ``StableDiffusionPipeline.__call__`` does, with its DDIM scheduler's
step in numpy.

- **captions**: the prompt and the negative prompt (default: the empty one) padded to the
  tokenizer's length, through text_encoder.onnx (int32 ids): the guidance pair.
- **the loop**: the scheduler's timesteps (``set_timesteps``: "leading" spacing, the step ratio
  ``num_train_timesteps // steps``, plus ``steps_offset``); each step runs the UNet once on the
  latents twice over (unconditional, conditional), mixes ``uncond + g * (cond - uncond)``
  (skipped at ``guidance_scale <= 1``), then DDIM's step with eta 0:
  x0 = (x - sqrt(1 - a_t) eps) / sqrt(a_t) (epsilon; v: x0 = sqrt(a_t) x - sqrt(1 - a_t) v and
  eps = sqrt(a_t) v + sqrt(1 - a_t) x), x_prev = sqrt(a_prev) x0 + sqrt(1 - a_prev) eps, where
  a_prev is the previous timestep's alpha_bar (or ``final_alpha_cumprod``: 1 with
  ``set_alpha_to_one``, else alpha_bar[0]).
- **pixels**: vae_decoder.onnx of latents / scaling_factor, then (x / 2 + 0.5) clipped to [0, 1],
  x 255, rounded: uint8 [H, W, 3], as diffusers' image processor makes a PIL image.

The starting latents are given (numpy cannot draw torch's ``randn``): ``latents`` [1, C, h, w],
scaled by ``init_noise_sigma`` (1 for DDIM). Only DDIM is reproduced here; another scheduler
class in scheduler_config.json is refused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from ortft.core.errors import InputError


class DDIM:
    """diffusers' ``DDIMScheduler`` with eta 0 (no clipping, no thresholding), from its config."""

    def __init__(self, config: dict[str, Any]):
        if config.get("_class_name", "DDIMScheduler") != "DDIMScheduler":
            raise InputError(f"scheduler {config['_class_name']}: this runner steps DDIM only")
        if config.get("clip_sample") or config.get("thresholding"):
            raise InputError("scheduler: clip_sample / thresholding are not reproduced")
        if config.get("timestep_spacing", "leading") != "leading":
            raise InputError(f"scheduler: timestep_spacing {config['timestep_spacing']!r}")
        self.train_steps = int(config.get("num_train_timesteps", 1000))
        self.offset = int(config.get("steps_offset", 0))
        self.prediction = config.get("prediction_type", "epsilon")
        self.alphas = alphas_cumprod(config)
        self.final = 1.0 if config.get("set_alpha_to_one", True) else float(self.alphas[0])
        self.ratio = 1

    def timesteps(self, steps: int) -> np.ndarray:
        self.ratio = self.train_steps // steps
        return (np.arange(0, steps) * self.ratio).round()[::-1].astype(np.int64) + self.offset

    def step(self, out: np.ndarray, t: int, x: np.ndarray) -> np.ndarray:
        prev = t - self.ratio
        a_t = self.alphas[t]
        a_prev = self.alphas[prev] if prev >= 0 else self.final
        b_t = 1.0 - a_t
        if self.prediction == "epsilon":
            x0, eps = (x - np.sqrt(b_t) * out) / np.sqrt(a_t), out
        elif self.prediction == "v_prediction":
            x0 = np.sqrt(a_t) * x - np.sqrt(b_t) * out
            eps = np.sqrt(a_t) * out + np.sqrt(b_t) * x
        else:
            raise InputError(f"scheduler: prediction_type {self.prediction!r}")
        return (np.sqrt(a_prev) * x0 + np.sqrt(1.0 - a_prev) * eps).astype(np.float32)


def alphas_cumprod(config: dict[str, Any]) -> np.ndarray:
    """The cumulative alphas of the config's beta schedule (linear or scaled_linear), in the
    float32 arithmetic diffusers uses (torch.linspace in float32, then cumprod)."""
    start, end = float(config.get("beta_start", 0.0001)), float(config.get("beta_end", 0.02))
    n, kind = int(config.get("num_train_timesteps", 1000)), config.get("beta_schedule", "linear")
    if kind == "linear":
        betas = np.linspace(start, end, n, dtype=np.float32)
    elif kind == "scaled_linear":
        betas = np.linspace(start**0.5, end**0.5, n, dtype=np.float32) ** 2
    else:
        raise InputError(f"scheduler: beta_schedule {kind!r} is not reproduced")
    return np.cumprod(1.0 - betas, dtype=np.float32)


class OnnxStableDiffusion:
    """The three graphs of an export folder, drawing as diffusers' pipeline draws."""

    def __init__(self, folder: Path):
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
        tok_config = json.loads((folder / "tokenizer" / "tokenizer_config.json").read_text())
        self.max_length = int(tok_config.get("model_max_length", 77))
        self.pad_id = self.tokenizer.token_to_id(tok_config.get("pad_token", "<|endoftext|>"))
        self.scheduler = DDIM(
            json.loads((folder / "scheduler" / "scheduler_config.json").read_text())
        )
        vae = json.loads((folder / "vae_decoder" / "config.json").read_text())
        self.scaling = float(vae.get("scaling_factor", 0.18215))
        timestep = next(i for i in self.unet.get_inputs() if i.name == "timestep")
        self.timestep_dtype = np.float32 if "float" in timestep.type else np.int64

    def ids(self, text: str) -> np.ndarray:
        """Padded to the tokenizer's length with its pad token, cut there (what the CLIP
        tokenizer does with padding="max_length", truncation=True)."""
        ids = self.tokenizer.encode(text).ids[: self.max_length]
        return np.array(ids + [self.pad_id] * (self.max_length - len(ids)), dtype=np.int32)

    def encode(self, prompt: str, negative: str | None) -> np.ndarray:
        ids = np.stack([self.ids(negative or ""), self.ids(prompt)])
        return self.text_encoder.run(None, {"input_ids": ids})[0]

    def draw(
        self, prompt: str, latents: np.ndarray, steps: int = 20, guidance_scale: float = 7.5,
        negative_prompt: str | None = None,
    ) -> np.ndarray:  # fmt: skip
        """uint8 [H, W, 3] from the starting ``latents`` [1, C, h, w]."""
        hidden = self.encode(prompt, negative_prompt)
        guided = guidance_scale > 1.0
        if not guided:
            hidden = hidden[1:]
        x = latents.astype(np.float32)  # init_noise_sigma is 1 for DDIM
        for t in self.scheduler.timesteps(steps):
            sample = np.concatenate([x, x]) if guided else x
            feeds = {"sample": sample, "timestep": np.array([t], dtype=self.timestep_dtype),
                     "encoder_hidden_states": hidden}  # fmt: skip
            out = self.unet.run(None, feeds)[0]
            if guided:
                out = out[:1] + guidance_scale * (out[1:] - out[:1])
            x = self.scheduler.step(out, int(t), x)
        image = self.vae_decoder.run(None, {"latent_sample": x / self.scaling})[0][0]
        pixels = np.clip(image / 2 + 0.5, 0.0, 1.0).transpose(1, 2, 0)
        return (pixels * 255).round().astype(np.uint8)
