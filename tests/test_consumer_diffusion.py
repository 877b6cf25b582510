"""The consumer tier for text-to-image (marker ``consumer``): a tiny Stable Diffusion's export
(``ortft export RUN``) drawn in the clean runtime of scripts/consumer-env.sh (onnxruntime,
numpy, tokenizers, Pillow; nothing of ortft's, torch or diffusers) with the folder's own
draw.py, and compared with diffusers' pipeline on the run's final/ in PyTorch, from the same
starting latents (numpy cannot draw torch's randn): the issue's bound is a pixel MAE of 2/255
over 20 steps, for each scheduler the numpy loop steps. The card's snippet runs there verbatim.
diffusers' own ``OnnxStableDiffusionPipeline`` opens the export folder as written and draws what
``ortft predict`` draws on it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import run_cli
from test_consumer import _consumer
from test_text_to_image import TINY
from typer.testing import CliRunner

from ortft.cli.app import app
from ortft.export import deploy
from ortft.families.text_to_image import graphs as diffusion
from ortft.families.text_to_image import runner

pytestmark = pytest.mark.consumer

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "a handwritten digit 3"
MAE_BOUND = 2.0  # 8-bit steps: the 2/255
ROUNDING_FLIPS = 2  # of an image's 8-bit values, one step each: diffusers' ONNX pipeline


@pytest.fixture(scope="module")
def export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2 steps on ort, then `ortft export RUN -o OUT` (the command, not training's export)."""
    run = tmp_path_factory.mktemp("t2i-consumer") / "run"
    res = run_cli("train", ROOT / "recipes" / "text-to-image.yaml", *TINY, "training.max_steps=2",
                  "export.enabled=false", "--output-dir", run, env={"NO_COLOR": "1"})  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    res = run_cli("export", run, "-o", run / "exported", "--json")
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads(res.stdout)["passed"] is True
    return run / "exported"


def _diffusers(final: Path, name: str, latents: np.ndarray, guidance: float) -> np.ndarray:
    import diffusers
    import torch

    pipe = diffusers.StableDiffusionPipeline.from_pretrained(str(final))
    pipe.set_progress_bar_config(disable=True)
    extra = runner.SWAP_OVERRIDES.get(name, {})
    pipe.scheduler = getattr(diffusers, runner.NAMES[name]).from_config(pipe.scheduler.config,
                                                                        **extra)  # fmt: skip
    image = pipe(PROMPT, num_inference_steps=20, guidance_scale=guidance,
                 latents=torch.from_numpy(latents), output_type="np").images[0]  # fmt: skip
    return (image * 255).round()


@pytest.mark.parametrize("name", sorted(runner.NAMES))
def test_draw_py_in_the_clean_runtime_draws_what_diffusers_draws(
    name: str, export: Path, consumer_python: str, tmp_path: Path
) -> None:
    latents = np.random.default_rng(7).standard_normal((1, 4, 4, 4)).astype(np.float32)
    np.save(tmp_path / "latents.npy", latents)
    for guidance in ("7.5", "1.0"):
        out = tmp_path / f"{name}-{guidance}.npy"
        _consumer(consumer_python, "-I", export / diffusion.DRAW_SCRIPT, "--prompt", PROMPT,
                  "--latents", tmp_path / "latents.npy", "--steps", "20", "--scheduler", name,
                  "--guidance-scale", guidance, "-o", out, cwd=tmp_path)  # fmt: skip
        got = np.load(out)
        want = _diffusers(export.parent / "final", name, latents, float(guidance))
        assert got.shape == want.shape == (8, 8, 3) and got.dtype == np.uint8
        assert np.abs(got - want).mean() <= MAE_BOUND, (name, guidance)


def test_the_card_snippet_draws_what_ortft_predict_draws(
    export: Path, consumer_python: str, tmp_path: Path
) -> None:
    """Run verbatim in a copy of the folder; `ortft predict` draws from the same seed with the
    same file on training's onnxruntime (another release than the clean runtime's)."""
    from PIL import Image

    folder = shutil.copytree(export, tmp_path / "card")
    code = deploy.card_snippet((folder / "README.md").read_text())
    # -E -s, not -I: the snippet imports draw.py from the folder it runs in (-I drops the cwd)
    assert _consumer(consumer_python, "-E", "-s", "-c", code, cwd=folder).strip() == "out.png"
    png = tmp_path / "predict.png"
    res = run_cli("predict", export, "--prompt", diffusion.CARD_PROMPT, "--steps", "20",
                  "--seed", "0", "-o", png)  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    got = np.asarray(Image.open(folder / "out.png"), dtype=float)
    want = np.asarray(Image.open(png), dtype=float)
    assert got.shape == want.shape and np.abs(got - want).mean() <= MAE_BOUND


@pytest.fixture(scope="module")
def onnx_pipeline(export: Path) -> tuple[Any, Any]:
    """diffusers' own ``OnnxStableDiffusionPipeline`` on the export folder as written (its
    model_index.json), and the scheduler it loaded from there. ``provider_options={}``: without
    it diffusers 0.42 passes an empty list beside ``providers=[provider]``, which onnxruntime
    refuses ("should be the same length") before falling back to the CPU provider anyway."""
    import diffusers

    pipe = diffusers.OnnxStableDiffusionPipeline.from_pretrained(
        str(export), provider="CPUExecutionProvider", provider_options={}
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe, pipe.scheduler


# None: the folder's own (DDIM); euler: diffusers 0.42's ONNX pipeline multiplies its numpy
# latents by EulerDiscreteScheduler's init_noise_sigma, a torch tensor (TypeError), so it draws
# with no Euler scheduler at all
@pytest.mark.parametrize("name", [None, "pndm"])
def test_diffusers_onnx_pipeline_draws_what_ortft_predict_draws(
    name: str | None, export: Path, onnx_pipeline: tuple[Any, Any], tmp_path: Path
) -> None:
    """The folder's scheduler (None) and each one `--scheduler` swaps in, set alike on both
    sides; the same starting latents (`ortft predict --seed`'s numpy draw). Both run the same
    graphs on the same onnxruntime: only the schedulers' float32 arithmetic (torch there, numpy
    here) differs: measured, the 8-bit pixels are equal; ``ROUNDING_FLIPS`` values may round
    the other way. A DDIM step off by one timestep moved 31 of the 192 by one step."""
    import diffusers
    from PIL import Image

    pipe, own = onnx_pipeline
    pipe.scheduler = own
    if name is not None:
        cls = getattr(diffusers, runner.NAMES[name])
        pipe.scheduler = cls.from_config(own.config, **runner.SWAP_OVERRIDES.get(name, {}))
    shape = runner.OnnxStableDiffusion(export).latent_shape()
    latents = runner.seeded_latents(shape, 5)
    # the pipeline takes the VAE's scale to be 8 (latents: height // 8), as in every Stable
    # Diffusion; the tiny VAE's is 2, so it is told the latents' side x 8 and the VAE decoder
    # gives the image at its own size
    image = pipe(PROMPT, num_inference_steps=20, guidance_scale=7.5, latents=latents,
                 height=shape[2] * 8, width=shape[3] * 8, output_type="np").images[0]  # fmt: skip
    got = (image * 255).round()
    png = tmp_path / "predict.png"
    args = ["--scheduler", name] if name else []
    res = CliRunner().invoke(app, ["predict", str(export), "--prompt", PROMPT, "--steps", "20",
                                   "--seed", "5", "-o", str(png), *args])  # fmt: skip
    assert res.exit_code == 0, res.stderr + str(res.exception)
    want = np.asarray(Image.open(png), dtype=float)
    assert got.shape == want.shape == (8, 8, 3)
    off = np.abs(got - want)
    assert off.max() <= 1 and np.count_nonzero(off) <= ROUNDING_FLIPS, (name, off.max(), off.sum())
