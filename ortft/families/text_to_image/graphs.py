"""text-to-image's ONNX export: a Stable Diffusion as four graphs, each checked against PyTorch.

    onnx/
      text_encoder/model.onnx   input_ids (int32 [batch, sequence]) -> last_hidden_state,
                                pooler_output
      unet/model.onnx           sample (float32 [batch, C, h, w]), timestep (float32 [steps]:
                                one value for the whole batch, or one per row),
                                encoder_hidden_states (float32 [batch, sequence, width])
                                -> out_sample
      vae_decoder/model.onnx    latent_sample (float32 [batch, C, h, w]) -> sample (pixels in
                                [-1, 1]); latents are divided by the VAE's scaling factor first
      vae_encoder/model.onnx    sample (pixels in [-1, 1], float32 [batch, 3, H, W]) ->
                                latent_sample: the mean of the VAE's latent distribution
                                (deterministic; multiply by the scaling factor, as diffusers'
                                ONNX img2img pipeline does)
      tokenizer/, scheduler/, model_index.json, export.json
      draw.py                   ortft.families.text_to_image.runner: draws with this folder
                                on onnxruntime, numpy and tokenizers alone
      README.md                 the card: what is here, and a snippet that draws

The folder layout and the input names are those ONNX Stable Diffusion pipelines read (diffusers'
``OnnxStableDiffusionPipeline`` reads the timestep's dtype from the session, casts caption ids to
int32 and passes one timestep for the batch). Each graph's parity sample: the run's own
captions, a seeded latent, timestep 500. ``runner`` (this family's) draws with them, with
onnxruntime and numpy alone.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from ortft.core.reports import ExportReport
from ortft.export import onnx_tools, parity
from ortft.families.text_to_image import runner

log = logging.getLogger("ortft")

GRAPHS = ("text_encoder", "unet", "vae_decoder", "vae_encoder")
PARITY_PROMPTS = ("a photo", "")  # a caption and the empty one (what guidance runs)
PARITY_TIMESTEP = 500.0


def _wrappers() -> dict[str, Any]:
    """The four graphs' modules (torch is imported here, when an export runs)."""
    import torch

    class TextEncoder(torch.nn.Module):
        def __init__(self, model: Any):
            super().__init__()
            self.model = model

        def forward(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            out = self.model(input_ids.long(), return_dict=True)
            return out.last_hidden_state, out.pooler_output

    class Unet(torch.nn.Module):
        def __init__(self, model: Any):
            super().__init__()
            self.model = model

        def forward(self, sample, timestep, encoder_hidden_states) -> torch.Tensor:
            t = timestep.expand(sample.shape[0]) if timestep.shape[0] == 1 else timestep
            return self.model(sample, t, encoder_hidden_states, return_dict=False)[0]

    class VaeDecoder(torch.nn.Module):
        def __init__(self, model: Any):
            super().__init__()
            self.model = model

        def forward(self, latent_sample: torch.Tensor) -> torch.Tensor:
            return self.model.decode(latent_sample, return_dict=False)[0]

    class VaeEncoder(torch.nn.Module):
        def __init__(self, model: Any):
            super().__init__()
            self.model = model

        def forward(self, sample: torch.Tensor) -> torch.Tensor:
            return self.model.encode(sample, return_dict=False)[0].mean

    return {
        "text_encoder": TextEncoder,
        "unet": Unet,
        "vae_decoder": VaeDecoder,
        "vae_encoder": VaeEncoder,
    }


def sample_feeds(unet: Any, vae: Any, text_encoder: Any, tokenizer: Any) -> dict[str, dict]:
    """Each graph's parity inputs (numpy): the prompts' ids, a seeded latent and timestep."""
    import torch

    ids = tokenizer(
        list(PARITY_PROMPTS),
        padding="max_length",
        max_length=tokenizer.model_max_length,
        truncation=True,
        return_tensors="np",
    )["input_ids"].astype(np.int32)
    with torch.no_grad():
        hidden = text_encoder(torch.from_numpy(ids).long())[0].float().numpy()
    size, channels = int(unet.config.sample_size), int(unet.config.in_channels)
    rng = np.random.default_rng(0)
    latents = rng.standard_normal((len(ids), channels, size, size)).astype(np.float32)
    pixels = size * 2 ** (len(vae.config.block_out_channels) - 1)
    images = rng.uniform(-1, 1, (len(ids), 3, pixels, pixels)).astype(np.float32)
    return {
        "text_encoder": {"input_ids": ids},
        "unet": {
            "sample": latents,
            "timestep": np.array([PARITY_TIMESTEP], dtype=np.float32),
            "encoder_hidden_states": hidden,
        },
        "vae_decoder": {"latent_sample": latents},
        "vae_encoder": {"sample": images},
    }


AXES = {
    "text_encoder": {
        "input_ids": {0: "batch", 1: "sequence"},
        "last_hidden_state": {0: "batch", 1: "sequence"},
        "pooler_output": {0: "batch"},
    },
    "unet": {
        "sample": {0: "batch", 2: "height", 3: "width"},
        "timestep": {0: "steps"},
        "encoder_hidden_states": {0: "batch", 1: "sequence"},
        "out_sample": {0: "batch", 2: "height", 3: "width"},
    },
    "vae_decoder": {
        "latent_sample": {0: "batch", 2: "height", 3: "width"},
        "sample": {0: "batch", 2: "pixel_height", 3: "pixel_width"},
    },
    "vae_encoder": {
        "sample": {0: "batch", 2: "pixel_height", 3: "pixel_width"},
        "latent_sample": {0: "batch", 2: "height", 3: "width"},
    },
}
OUTPUTS = {
    "text_encoder": ("last_hidden_state", "pooler_output"),
    "unet": ("out_sample",),
    "vae_decoder": ("sample",),
    "vae_encoder": ("latent_sample",),
}


def _export_one(name: str, module: Any, feeds: dict, folder: Path, opset: int) -> float:
    import torch

    (folder / name).mkdir(parents=True, exist_ok=True)
    example = tuple(torch.from_numpy(v) for v in feeds.values())
    return onnx_tools.torch_export(
        module,
        example,
        folder / name / "model.onnx",
        opset,
        list(feeds),
        OUTPUTS[name],
        AXES[name],
    )


def _reference(name: str, module: Any, feeds: dict) -> list[np.ndarray]:
    import torch

    with torch.no_grad():
        out = module(*(torch.from_numpy(v) for v in feeds.values()))
    outs = out if isinstance(out, tuple) else (out,)
    return [o.float().numpy() for o in outs]


def build(pipe: Any, folder: Path, opset: int, tolerance: float) -> ExportReport:
    """The four graphs of ``pipe`` (a diffusers ``StableDiffusionPipeline`` on the CPU, in
    fp32, LoRA merged), with the tokenizer, scheduler and model_index.json, into ``folder``;
    the report (``parity.finish`` gives the verdict)."""
    from diffusers.models.attention_processor import AttnProcessor

    pipe.unet.set_attn_processor(AttnProcessor())  # plain matmul + softmax: any opset runs it
    modules = {
        "text_encoder": pipe.text_encoder,
        "unet": pipe.unet,
        "vae_decoder": pipe.vae,
        "vae_encoder": pipe.vae,
    }
    wrap = _wrappers()
    feeds = sample_feeds(pipe.unet, pipe.vae, pipe.text_encoder, pipe.tokenizer)
    graphs: dict[str, dict[str, Any]] = {}
    seconds = 0.0
    for name in GRAPHS:
        module = wrap[name](modules[name].eval()).eval()
        seconds += _export_one(name, module, feeds[name], folder, opset)
        want = _reference(name, module, feeds[name])
        sess = parity.session(folder / name / "model.onnx")
        got = sess.run(None, feeds[name])
        diff = max(float(np.max(np.abs(g - w))) for g, w in zip(got, want, strict=True))
        graphs[name] = {
            "max_abs_diff": diff,
            "inputs": list(feeds[name]),
            "outputs": list(OUTPUTS[name]),
        }
        log.info("export: %s/model.onnx, max |diff| %.2e against PyTorch", name, diff)
    write_pipeline_files(pipe, folder)
    worst = max(g["max_abs_diff"] for g in graphs.values())
    return {
        "format_version": parity.EXPORT_FORMAT_VERSION,
        "task": "text-to-image",
        "model_type": "stable-diffusion",
        "opset": opset,
        "export_s": round(seconds, 3),
        "files": {name: f"{name}/model.onnx" for name in GRAPHS},
        "parity": {
            "max_abs_diff": worst,
            "tolerance": tolerance,
            "passed": worst <= tolerance,
            "graphs": graphs,
            "source": "pytorch fp32",
        },
    }


def write_pipeline_files(pipe: Any, folder: Path) -> None:
    """tokenizer/ (tokenizer.json: what a client loads with ``tokenizers``), scheduler/, each
    graph's config.json, model_index.json naming the parts, draw.py and the card."""
    pipe.tokenizer.save_pretrained(folder / "tokenizer")
    pipe.scheduler.save_pretrained(folder / "scheduler")
    for name, model in (
        ("text_encoder", pipe.text_encoder),
        ("unet", pipe.unet),
        ("vae_decoder", pipe.vae),
        ("vae_encoder", pipe.vae),
    ):
        config = model.config.to_dict() if hasattr(model.config, "to_dict") else dict(model.config)
        (folder / name / "config.json").write_text(json.dumps(config, indent=2, default=str))
    index = {
        "_class_name": "OnnxStableDiffusionPipeline",
        "text_encoder": ["diffusers", "OnnxRuntimeModel"],
        "unet": ["diffusers", "OnnxRuntimeModel"],
        "vae_decoder": ["diffusers", "OnnxRuntimeModel"],
        "vae_encoder": ["diffusers", "OnnxRuntimeModel"],
        "tokenizer": ["transformers", type(pipe.tokenizer).__name__],
        "scheduler": ["diffusers", type(pipe.scheduler).__name__],
        "safety_checker": [None, None],
        "feature_extractor": [None, None],
        "requires_safety_checker": False,
    }
    (folder / "model_index.json").write_text(json.dumps(index, indent=2))
    shutil.copyfile(runner.__file__, folder / DRAW_SCRIPT)
    (folder / "README.md").write_text(card(pipe))


DRAW_SCRIPT = "draw.py"  # this family's runner.py, beside the graphs it draws with
CARD_PROMPT = "a photo"


def card(pipe: Any) -> str:
    """The export's README.md: its parts and a snippet that draws (onnxruntime, numpy,
    tokenizers and Pillow; tests/test_consumer_diffusion.py runs it verbatim)."""
    from ortft.export.deploy import CARD_FENCE

    scheduler = type(pipe.scheduler).__name__
    return f"""# A Stable Diffusion, exported by ortft

The ONNX graphs of a text-to-image run in the layout of ONNX Stable Diffusion pipelines:
`text_encoder/`, `unet/`, `vae_decoder/` and `vae_encoder/` (`model.onnx` and `config.json`
each), `tokenizer/`, `scheduler/` ({scheduler}), `model_index.json`, and `export.json` (each
graph's parity against PyTorch).

`draw.py` draws with them on onnxruntime, numpy and tokenizers alone (Pillow writes the PNG):
the prompt's guidance pair through the text encoder, the scheduler's steps in numpy (DDIM,
Euler discrete or PNDM: `--scheduler`), then the VAE decoder:

    python draw.py --prompt "{CARD_PROMPT}" --steps 20 --seed 0 -o out.png

From Python, with your own starting latents (numpy's generator; unit variance):

{CARD_FENCE}
from PIL import Image
from draw import OnnxStableDiffusion, seeded_latents

pipe = OnnxStableDiffusion(".")
latents = seeded_latents(pipe.latent_shape(), seed=0)
Image.fromarray(pipe.draw("{CARD_PROMPT}", latents, steps=20)).save("out.png")
print("out.png")
```
"""


# final/lora/: a LoRA run's UNet weights in diffusers' format (what pipe.load_lora_weights reads)
LORA_DIR, LORA_FILE = "lora", "pytorch_lora_weights.safetensors"


def load_pipeline(folder: Path, fuse: bool = False) -> Any:
    """diffusers' pipeline of a diffusers folder (a text-to-image run's final/; fp32, CPU), with
    the LoRA weights of ``folder/lora/`` where it has them: loaded on top, or with ``fuse``
    folded into the UNet's weights and the adapter removed (what an export needs)."""
    from diffusers import DiffusionPipeline
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as hf_logging

    from ortft.core.errors import InputError, first_line

    hf_logging.disable_progress_bar()
    diffusers_logging.disable_progress_bar()
    try:
        pipe = DiffusionPipeline.from_pretrained(str(folder))
    except (OSError, ValueError, KeyError, TypeError) as err:
        first = first_line(err)
        raise InputError(f"{folder}: cannot load the diffusers model ({first})") from None
    if (folder / LORA_DIR / LORA_FILE).is_file():
        pipe.load_lora_weights(str(folder / LORA_DIR))
        log.info("LoRA weights: %s%s", folder / LORA_DIR / LORA_FILE, " (fused)" if fuse else "")
        if fuse:
            pipe.fuse_lora()
            pipe.unload_lora_weights()
    pipe.set_progress_bar_config(disable=True)
    return pipe


def export(pipe: Any, out_dir: Path, opset: int, tolerance: float) -> ExportReport:
    """``build`` into a staging folder, published as ``out_dir`` when parity passed (else
    ``out_dir.failed``); the report."""
    shutil.rmtree(out_dir.with_name(out_dir.name + ".failed"), ignore_errors=True)
    return parity.publish(out_dir, lambda tmp: build(pipe, tmp, opset, tolerance))
