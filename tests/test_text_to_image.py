"""text-to-image (Stable Diffusion): the task's collate (targets, min-SNR, caption dropout,
crop and flip, seeded per row) on stand-in encoders, and end-to-end runs of a tiny SD from a
config through the CLI on the profile's default backend (ORT on the ort profile): final/ loads in diffusers and draws, `ortft eval` repeats a run's
eval loss, a run resumes exactly after kill -9, bad model folders are one line, final/lora/
keeps its alpha. Both shipped recipes (full and LoRA, whose weights
diffusers loads) train in the recipes tier (tests/test_shipped_recipes.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import DEFAULT_BACKEND
from helpers import losses, run_cli

from ortft import tasks

ROOT = Path(__file__).resolve().parent.parent
DIGITS = ROOT / "recipes" / "data" / "digits"


class Encoders:
    """Stand-ins for the frozen VAE and text encoder: a latent mean from the pixels (2x2 average
    pooling, one channel per colour + their sum), std 0 unless given; the caption ids as hidden
    states (so a dropped caption shows)."""

    def __init__(self, std: float = 0.0):
        self.std = std

    def latent_moments(self, pixels):
        b, c, h, w = pixels.shape
        pooled = pixels.reshape(b, c, h // 2, 2, w // 2, 2).mean(axis=(3, 5))
        mean = np.concatenate([pooled, pooled.sum(axis=1, keepdims=True)], axis=1)
        return mean, np.full_like(mean, self.std)

    def hidden_states(self, ids):
        return ids[..., None].astype(np.float32)


def schedule():
    from diffusers import DDPMScheduler

    from ortft.families.text_to_image import diffusion

    return DDPMScheduler(**diffusion.SD_SCHEDULE)


def task(unet=None, **options):
    from ortft.families.text_to_image import diffusion

    t = tasks.get("text-to-image", {"resolution": 8, **options})
    t.empty_ids = np.array([0, 1, 1, 1], dtype=np.int64)
    sched = schedule()
    t.bind_frozen(Encoders(), diffusion.alphas_cumprod(sched), "epsilon", unet)
    return t


def batch(n: int = 6, rows=None):
    images = sorted((DIGITS / "images").glob("*.png"))[:n]
    return {
        "_image": np.array([str(p).encode() for p in images], dtype="S"),
        "_row": np.array(rows if rows is not None else range(n), dtype=np.int64),
        "_ids": np.tile(np.array([0, 5, 6, 1], dtype=np.int64), (n, 1)),
        "labels": np.ones(n, dtype=np.int64),
    }


@pytest.mark.parametrize("prediction", ["epsilon", "v_prediction"])
def test_noisy_latents_and_target_follow_the_scheduler(prediction):
    """DDPM's forward process and target, as diffusers' scheduler computes them."""
    import torch

    t = task(prediction_type=prediction)
    out = t.collate(batch(), epoch=0, seed=1)
    latents = Encoders().latent_moments(_pixels(t, out))[0]
    steps = torch.from_numpy(out["timesteps"])
    a = np.sqrt(t.alphas[out["timesteps"]]).reshape(-1, 1, 1, 1)
    b = np.sqrt(1 - t.alphas[out["timesteps"]]).reshape(-1, 1, 1, 1)
    noise = (out["noisy_latents"] - a * latents) / b
    sched = schedule()
    lat, eps = torch.from_numpy(latents).float(), torch.from_numpy(noise).float()
    want_noisy = sched.add_noise(lat, eps, steps).numpy()
    np.testing.assert_allclose(out["noisy_latents"], want_noisy, atol=1e-5)
    want = eps.numpy() if prediction == "epsilon" else sched.get_velocity(lat, eps, steps).numpy()
    np.testing.assert_allclose(out["target"], want, atol=1e-5)
    assert 0.5 < float(noise.std()) < 1.5  # real noise, not zeros


def _pixels(t, out):
    """The pixels collate saw for its train batch (seed 1, epoch 0): each row's crop is the first
    draw of its own generator, so a fresh generator per row repeats it."""
    rngs = [np.random.default_rng([1, 0, int(r)]) for r in out["_row"]]
    pairs = zip(out["_image"], rngs, strict=True)
    return np.stack([t._pixels(p.decode(), g, True) for p, g in pairs])


@pytest.mark.parametrize("prediction", ["epsilon", "v_prediction"])
def test_min_snr_weights_match_diffusers(prediction):
    import torch
    from diffusers.training_utils import compute_snr

    t = task(snr_gamma=5.0, prediction_type=prediction)
    steps = np.array([1, 10, 100, 500, 999])
    snr = compute_snr(schedule(), torch.from_numpy(steps))
    weight = torch.stack([snr, 5.0 * torch.ones_like(snr)], dim=1).min(dim=1)[0]
    weight = weight / snr if prediction == "epsilon" else weight / (snr + 1)
    np.testing.assert_allclose(t.snr_weights(steps), weight.numpy(), rtol=1e-5)
    assert not np.allclose(t.snr_weights(steps), 1.0)
    np.testing.assert_array_equal(task().snr_weights(steps), np.ones(5, dtype=np.float32))


def test_caption_dropout_drops_train_captions_only():
    kept = task(caption_dropout=0.0).collate(batch(), epoch=0, seed=1)["encoder_hidden_states"]
    assert (kept[..., 0] == [0, 5, 6, 1]).all()
    drop = task(caption_dropout=0.99)
    dropped = drop.collate(batch(), epoch=0, seed=1)["encoder_hidden_states"]
    assert (dropped[..., 0] == [0, 1, 1, 1]).all()
    evals = drop.collate(batch(), epoch=None, seed=1)["encoder_hidden_states"]
    assert (evals[..., 0] == [0, 5, 6, 1]).all()  # eval always sees its caption


def test_each_row_draws_the_same_wherever_it_falls_in_a_batch():
    t = task(random_flip=True, caption_dropout=0.5)
    whole = t.collate(batch(6), epoch=3, seed=7)
    part = {k: v[[4, 1]] for k, v in batch(6).items()}
    swapped = t.collate(part, epoch=3, seed=7)
    for key in ("noisy_latents", "timesteps", "target", "encoder_hidden_states"):
        np.testing.assert_array_equal(swapped[key], whole[key][[4, 1]])
    other = t.collate(batch(6), epoch=4, seed=7)
    assert not np.array_equal(other["timesteps"], whole["timesteps"])  # a new epoch, new draws


def test_crop_and_flip(tmp_path):
    """An image twice as wide as high: resized to the resolution on its shorter side, cropped
    in the centre (eval, center_crop) or at a seeded random place; mirrored for some train rows."""
    from PIL import Image

    arr = np.zeros((8, 16, 3), dtype=np.uint8)
    arr[:, :4] = 255  # a white band on the left
    path = tmp_path / "wide.png"
    Image.fromarray(arr).save(path)
    t = task(random_flip=True)
    centre = t._pixels(str(path), np.random.default_rng(0), train=False)
    assert centre.shape == (3, 8, 8)
    assert centre.max() < 0  # the centre of the image: no white band
    crops = [t._pixels(str(path), np.random.default_rng(i), train=True) for i in range(60)]
    white_left = sum(bool((c[:, :, 0] > 0.9).all()) for c in crops)
    white_right = sum(bool((c[:, :, -1] > 0.9).all()) for c in crops)
    assert white_left and white_right  # a random crop at the left edge, sometimes mirrored
    no_flip = task(center_crop=True)
    assert all(
        np.array_equal(no_flip._pixels(str(path), np.random.default_rng(i), True), centre)
        for i in range(5)
    )


def test_ema_follows_the_trained_weights_and_its_state_round_trips(tmp_path):
    """diffusers' EMAModel: the first update copies the weights, then decay min(d, (1 + s) / (10
    + s)); the checkpointed state restores it exactly; a checkpoint without it is one line."""
    import torch

    from ortft.core.errors import InputError

    unet = torch.nn.Linear(3, 2)
    t = task(unet=unet, ema_decay=0.5)
    with torch.no_grad():
        unet.weight.fill_(1.0)
    t.after_step()
    shadow = t.ema.shadow_params[0]
    assert torch.allclose(shadow, unet.weight)  # decay 0 on the first step
    with torch.no_grad():
        unet.weight.fill_(3.0)
    t.after_step()
    decay = (1 + 1) / (10 + 1)
    assert torch.allclose(t.ema.shadow_params[0], torch.full_like(shadow, decay + (1 - decay) * 3))
    again = task(unet=torch.nn.Linear(3, 2), ema_decay=0.5)
    again.load_state_dict(t.state_dict(), tmp_path)
    assert torch.equal(again.ema.shadow_params[0], t.ema.shadow_params[0])
    assert again.ema.optimization_step == 2
    with pytest.raises(InputError, match="no EMA weights"):
        again.load_state_dict(None, tmp_path)
    assert task().state_dict() is None  # no EMA asked: nothing kept


def test_options_are_checked():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="multiple of 8"):
        tasks.options("text-to-image", resolution=20)
    with pytest.raises(ValidationError, match="label"):
        tasks.options("text-to-image", caption_template="a photo")


# --------------------------------------------------------------------------- end to end

TINY = [
    "model.from_config.hidden_size=16", "model.from_config.num_layers=1",
    "model.from_config.options.unet_channels=16", "model.from_config.options.vae_channels=8",
    "task.resolution=8", "training.batch_size=4", "data.max_train_samples=16",
    "data.eval=null", "data.eval_fraction=0", "training.eval_every=null", "training.log_every=1",
]  # fmt: skip


def train(recipe: str, out: Path, *overrides: str):
    res = run_cli("train", ROOT / "recipes" / recipe, *TINY, *overrides, "--output-dir", out,
                  env={"NO_COLOR": "1"})  # fmt: skip
    return res


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    """4 steps on the default backend (ort on the ort profile), a checkpoint every 2 (the
    uninterrupted run of the resume test)."""
    out = tmp_path_factory.mktemp("t2i") / "full"
    prompts = 'task.validation_prompts=["a handwritten digit 1", "a handwritten digit 7"]'
    res = train("text-to-image.yaml", out, *RESUME, prompts, "task.validation_every=3")
    assert res.returncode == 0, res.stderr[-3000:]
    return out


RESUME = (
    "training.max_steps=4",
    "checkpoint.save_every=2",
    "training.seed=3",
    "task.ema_decay=0.9",
    f"backend.name={DEFAULT_BACKEND}",
)


@pytest.mark.ort
def test_full_run_trains_the_unet_on_ort_and_final_draws(full_run, tmp_path):
    import torch
    from diffusers import StableDiffusionPipeline
    from PIL import Image
    from safetensors.torch import load_file

    summary = json.loads((full_run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 4
    assert summary["backend"]["used"] == "ort" and summary["backend"]["fallback"] is False
    assert summary["trainable_parameters"] == summary["parameters"]  # full fine-tuning
    assert all(np.isfinite(v) for v in losses(full_run))
    # the validation prompts, drawn at step 3 (task.validation_every) and at the last step
    for step in ("step-000003", "step-000004"):
        drawn = sorted(p.name for p in (full_run / "validation" / step).iterdir())
        assert drawn == ["00.png", "01.png"]
        assert Image.open(full_run / "validation" / step / "00.png").size == (8, 8)
    final = full_run / "final"
    saved = load_file(final / "unet" / "diffusion_pytorch_model.safetensors")
    step = load_file(full_run / "step-000004" / "model.safetensors")
    ema = torch.load(full_run / "step-000004" / "task_state.pt", weights_only=True)["ema"]
    assert sorted(saved) == sorted(step) and ema["optimization_step"] == 4
    # final/ holds the EMA of the trained weights (task.ema_decay), not the last step's
    from diffusers import UNet2DConditionModel

    names = [n for n, _ in UNet2DConditionModel.from_pretrained(final / "unet").named_parameters()]
    shadow = dict(zip(names, ema["shadow_params"], strict=True))  # in the UNet's parameter order
    assert all(torch.equal(saved[k], shadow[k]) for k in step)
    assert not all(torch.equal(saved[k], step[k]) for k in step)
    # `ortft predict --prompt` draws what diffusers' own pipeline draws from final/ (same seed)
    png = tmp_path / "three.png"
    res = run_cli("predict", full_run, "--prompt", "a handwritten digit 3", "--steps", "3",
                  "--seed", "5", "-o", png, "--json")  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    assert json.loads(res.stdout)["image"] == str(png)
    drawn = np.asarray(Image.open(png))
    pipe = StableDiffusionPipeline.from_pretrained(str(final))
    want = pipe("a handwritten digit 3", num_inference_steps=3, height=8, width=8,
                generator=torch.Generator().manual_seed(5), output_type="pil").images[0]  # fmt: skip
    assert drawn.shape == (8, 8, 3)
    np.testing.assert_array_equal(drawn, np.asarray(want))


def test_the_onnx_export_draws_what_diffusers_draws(full_run, tmp_path):
    """onnx/ (written at the end of training): four graphs with parity against PyTorch; the
    numpy loop on them (DDIM, the folder's; Euler and PNDM swapped in from its config), from the
    same starting latents, draws diffusers' image from final/ with the same scheduler (the
    issue's bound: pixel MAE <= 2/255 over 20 steps; measured 0 for all three); `ortft predict`
    draws from it with onnxruntime, and with PyTorch on the scheduler asked for."""
    import diffusers
    import torch
    from diffusers import StableDiffusionPipeline

    from ortft.families.text_to_image import runner

    report = json.loads((full_run / "onnx" / "export.json").read_text())
    assert report["passed"] and sorted(report["parity"]["graphs"]) == [
        "text_encoder", "unet", "vae_decoder", "vae_encoder"]  # fmt: skip
    pipe = StableDiffusionPipeline.from_pretrained(str(full_run / "final"))
    pipe.set_progress_bar_config(disable=True)
    config = pipe.scheduler.config
    latents = np.random.default_rng(1).standard_normal((1, 4, 4, 4)).astype(np.float32)
    for name, cls in runner.NAMES.items():
        pipe.scheduler = getattr(diffusers, cls).from_config(config, **runner.SWAP_OVERRIDES.get(
            name, {}))  # fmt: skip
        onnx = runner.OnnxStableDiffusion(full_run / "onnx", name)
        for guidance in (7.5, 1.0):
            want = pipe("a handwritten digit 3", num_inference_steps=20, guidance_scale=guidance,
                        latents=torch.from_numpy(latents), output_type="np").images[0]  # fmt: skip
            want = (want * 255).round()
            got = onnx.draw("a handwritten digit 3", latents, steps=20, guidance_scale=guidance)
            assert got.shape == (8, 8, 3) and got.dtype == np.uint8
            assert np.abs(got - want).mean() <= 2.0, (name, guidance)
    png = tmp_path / "onnx.png"
    res = run_cli("predict", full_run / "onnx", "--prompt", "a handwritten digit 3",
                  "--steps", "4", "--scheduler", "euler", "-o", png, "--json")  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    drawn = json.loads(res.stdout)
    assert drawn["runtime"] == "onnxruntime" and drawn["scheduler"] == "EulerDiscreteScheduler"
    assert png.is_file()
    from ortft.families.text_to_image import draw  # PyTorch's pipeline, in process (CLI: above)

    opts = draw.DrawOptions("a", steps=2, scheduler="pndm")
    assert draw.draw(full_run, opts, tmp_path / "torch.png")["scheduler"] == "PNDMScheduler"


def test_predict_draws_at_height_and_width_away_from_the_negative_prompt(full_run, tmp_path):
    """`ortft predict --height 16 --width 8 --negative-prompt ...` (in process): the PNG is 8
    wide and 16 high, and it is what diffusers' pipeline draws from final/ with that negative
    prompt, not without it; the ONNX export draws that size, and the negative prompt changes
    its image too."""
    import torch
    from diffusers import StableDiffusionPipeline
    from PIL import Image
    from typer.testing import CliRunner

    from ortft.cli.app import app

    prompt, negative = "a handwritten digit 3", "a handwritten digit 7"

    def predict(source: Path, name: str, *extra: str) -> np.ndarray:
        png = tmp_path / name
        args = ["--prompt", prompt, "--steps", "2", "--seed", "5", "--height", "16"]
        res = CliRunner().invoke(
            app, ["predict", str(source), *args, "--width", "8", "-o", str(png), *extra]
        )
        assert res.exit_code == 0, res.output
        return np.asarray(Image.open(png))

    pipe = StableDiffusionPipeline.from_pretrained(str(full_run / "final"))
    pipe.set_progress_bar_config(disable=True)

    def want(negative_prompt: str | None) -> np.ndarray:
        generator = torch.Generator().manual_seed(5)
        steps = {"num_inference_steps": 2, "height": 16, "width": 8}
        image = pipe(prompt, negative_prompt=negative_prompt, generator=generator, **steps)
        return np.asarray(image.images[0])

    drawn = predict(full_run, "torch.png", "--negative-prompt", negative)
    assert drawn.shape == (16, 8, 3)
    np.testing.assert_array_equal(drawn, want(negative))
    assert not np.array_equal(drawn, want(None))
    onnx_plain = predict(full_run / "onnx", "onnx.png")
    onnx_negative = predict(full_run / "onnx", "onnx-neg.png", "--negative-prompt", negative)
    assert onnx_plain.shape == onnx_negative.shape == (16, 8, 3)
    assert not np.array_equal(onnx_plain, onnx_negative)


def test_a_scheduler_the_numpy_loop_does_not_reproduce_is_one_line(full_run, tmp_path):
    """In process (the CLI turns an InputError into its one line and exit 2)."""
    import shutil

    from ortft.core.errors import InputError
    from ortft.families.text_to_image import draw

    folder = shutil.copytree(full_run / "onnx", tmp_path / "onnx")
    config_file = folder / "scheduler" / "scheduler_config.json"
    config = json.loads(config_file.read_text())
    config_file.write_text(json.dumps({**config, "_class_name": "LMSDiscreteScheduler"}))
    with pytest.raises(InputError, match="LMSDiscreteScheduler: not reproduced in numpy.*"
                       "--scheduler ddim, euler or pndm"):  # fmt: skip
        draw.draw(folder, draw.DrawOptions("a"), tmp_path / "x.png")
    drawn = draw.draw(folder, draw.DrawOptions("a", steps=2, scheduler="ddim"), tmp_path / "x.png")
    assert drawn["scheduler"] == "DDIMScheduler" and (tmp_path / "x.png").is_file()


def test_full_run_resumes_exactly_after_kill_9(full_run, tmp_path):
    """Killed with kill -9 right after step 2's checkpoint and resumed: steps 3-4 give the
    uninterrupted run's losses (each row's noise, timestep and crop come from its own seeded
    stream, and ORT's graph has no random op of its own)."""
    import signal
    import subprocess
    import time

    from helpers import start_cli

    cut = tmp_path / "cut"
    args = ["train", ROOT / "recipes" / "text-to-image.yaml", *TINY, *RESUME, "--output-dir", cut]
    with open(tmp_path / "cut.err", "w") as err:
        proc = start_cli(*args, stdout=subprocess.DEVNULL, stderr=err)
    deadline = time.monotonic() + 600
    while not (cut / "step-000002" / "manifest.json").exists():
        assert proc.poll() is None, (tmp_path / "cut.err").read_text()[-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    res = run_cli(*args)
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((cut / "summary.json").read_text())
    assert summary["resumed_from"].endswith("step-000002")
    assert summary["backend"]["used"] == DEFAULT_BACKEND  # the full run's backend
    want, got = losses(full_run, by_step=True), losses(cut, by_step=True)
    assert [got[s] for s in (3, 4)] == pytest.approx([want[s] for s in (3, 4)], abs=1e-6)
    from safetensors.torch import load_file

    unet = "final/unet/diffusion_pytorch_model.safetensors"
    a, b = load_file(full_run / unet), load_file(cut / unet)
    assert all(np.array_equal(a[k].numpy(), b[k].numpy()) for k in a)  # the EMA resumed too


EVAL_ROWS = 4  # the v-prediction run's eval: the first 4 digits of eval.csv, at its one step


@pytest.fixture(scope="module")
def vpred_run(full_run, tmp_path_factory):
    """The full run's final/ (a diffusers folder) trained on for 1 step on torch, predicting
    the velocity, min-SNR weighted, with an eval (on torch it costs 0.1 s; on ort its eval graph
    is a second ORTModule export: measured +8 s for the full run)."""
    out = tmp_path_factory.mktemp("t2i") / "vpred"
    res = run_cli("train", ROOT / "recipes" / "text-to-image.yaml", *TINY, "model.from_config=null",
                  f"model.name_or_path={full_run / 'final'}", "task.prediction_type=v_prediction",
                  "task.snr_gamma=5.0", "data.eval=data/digits/eval.csv",
                  f"data.max_eval_samples={EVAL_ROWS}", "training.max_steps=1",
                  "backend.name=torch", "--output-dir", out)  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    return out


def test_a_diffusers_folder_trains_and_final_draws_what_was_asked(full_run, vpred_run):
    """model.name_or_path: the full run's final/ (a diffusers folder) trained on, with
    task.prediction_type=v_prediction over its epsilon scheduler: the new final/'s scheduler
    says v_prediction (diffusers' pipeline then draws with what the UNet learned)."""
    out = vpred_run
    before = json.loads((full_run / "final" / "scheduler" / "scheduler_config.json").read_text())
    after = json.loads((out / "final" / "scheduler" / "scheduler_config.json").read_text())
    assert before["prediction_type"] == "epsilon" and after["prediction_type"] == "v_prediction"
    assert after["_class_name"] == before["_class_name"] == "DDIMScheduler"
    assert np.isfinite(losses(out)).all()


def test_eval_repeats_the_runs_eval_loss(full_run, vpred_run, tmp_path):
    """`ortft eval RUN` is the loop's eval by its own code (v prediction, min-SNR): on the run's
    eval split, or the same rows given with --data, summary.json's eval_loss (measured: equal;
    an ort run's to 2e-8, ORT's graph against PyTorch's UNet). final/ of an EMA run holds the
    EMA's weights (the loop evaluates the live ones); a recipe without eval data, and an ONNX
    export, are one line and exit 2."""
    import csv

    from typer.testing import CliRunner

    from ortft.cli.app import app

    def score(*args, code=0):
        res = CliRunner().invoke(app, ["eval", *map(str, args)])
        assert res.exit_code == code and "Traceback" not in res.stderr, res.stderr[-2000:]
        return res

    want = json.loads((vpred_run / "summary.json").read_text())["metrics"]["eval_loss"]
    got = json.loads(score(vpred_run, "--json").stdout)
    assert (got["task"], got["examples"], got["ema_weights"]) == ("text-to-image", EVAL_ROWS, False)
    assert got["metrics"]["loss"] == pytest.approx(want, abs=1e-5)
    with open(DIGITS / "eval.csv") as fh:
        rows = list(csv.DictReader(fh))[:EVAL_ROWS]
    given = tmp_path / "given.csv"
    given.write_text("image,label\n" + "".join(f"{DIGITS / r['image']},{r['label']}\n"
                                               for r in rows))  # fmt: skip
    text = score(vpred_run, "--data", given).stdout  # printed as every task's eval is
    assert f"data      {given} ({EVAL_ROWS} examples)" in text
    assert float(text.split("loss")[1].split()[0]) == pytest.approx(want, abs=1e-4)
    ema = json.loads(score(full_run, "--data", given, "--json").stdout)
    assert ema["ema_weights"] is True and np.isfinite(ema["metrics"]["loss"])
    res = score(full_run, code=2)  # its recipe has data.eval=null
    assert "no eval data; pass --data FILE" in res.stderr
    res = score(full_run / "onnx", code=2)
    assert len(res.stderr.strip().splitlines()) == 1 and "latent mean and std" in res.stderr
    assert f"`ortft eval {full_run}`" in res.stderr


def test_a_cut_weights_file_is_one_line(full_run, tmp_path):
    """In process (the CLI turns an InputError into its one line and exit 2)."""
    import shutil

    from ortft.core.errors import InputError
    from ortft.families.text_to_image import diffusion

    folder = tmp_path / "cut"
    shutil.copytree(full_run / "final", folder)
    weights = folder / "unet" / "diffusion_pytorch_model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    tok = diffusion.load_tokenizer(folder / "tokenizer")
    with pytest.raises(InputError, match="cannot load the model"):
        diffusion.load(folder, tok)


def test_tiny_sizes_are_checked_and_any_width_builds(tmp_path):
    from ortft.core.errors import InputError
    from ortft.families.text_to_image import diffusion
    from ortft.recipe.model import FromConfig

    tok = diffusion.char_tokenizer(tmp_path / "tok", 16)
    spec = FromConfig(architecture="stable-diffusion", hidden_size=8, num_layers=1, num_heads=2,
                      options={"unet_channels": 12, "vae_channels": 10})  # fmt: skip
    parts = diffusion.tiny(spec, tok, 8, 0, "epsilon")  # groups gcd(8, 12, 10) = 2
    assert parts.unet.config.block_out_channels == (12, 24)
    with pytest.raises(InputError, match="unet_channels must be whole numbers"):
        diffusion.tiny(
            spec.model_copy(update={"options": {"unet_channels": 0}}), tok, 8, 0, "epsilon"
        )
    with pytest.raises(InputError, match="not a tiny Stable Diffusion size"):
        diffusion.tiny(spec.model_copy(update={"options": {"width": 4}}), tok, 8, 0, "epsilon")


def test_final_lora_keeps_its_alpha(tmp_path):
    """A LoRA of alpha 16 and rank 4 saved in final/lora/ loads at the scale it trained with
    (the adapter's config in the file's metadata; without it diffusers takes alpha = rank and
    the UNet's output moved by 0.66 here): on top, as eval and predict load it, and fused, as
    the export does."""

    import torch

    from ortft.families.text_to_image import diffusion
    from ortft.families.text_to_image import graphs as sd_export
    from ortft.recipe.model import AdapterSection, FromConfig

    tok = diffusion.char_tokenizer(tmp_path / "tok", 16)
    spec = FromConfig(architecture="stable-diffusion", hidden_size=8, num_layers=1, num_heads=2,
                      options={"unet_channels": 8, "vae_channels": 8})  # fmt: skip
    parts = diffusion.tiny(spec, tok, 8, 0, "epsilon")
    adapter = AdapterSection(rank=4, alpha=16, dropout=0.0)
    unet = diffusion.prepare_unet(parts.unet, adapter)
    torch.manual_seed(0)
    with torch.no_grad():  # LoRA's B starts at 0: give it weights, as training would
        for name, p in unet.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    diffusion.save_final(tmp_path / "final", unet, parts)
    x, t, h = torch.randn(2, 4, 4, 4), torch.tensor([10, 500]), torch.randn(2, 16, 8)
    with torch.no_grad():
        want = unet(x, t, h).sample
        for fuse in (False, True):
            pipe = sd_export.load_pipeline(tmp_path / "final", fuse=fuse)
            assert (pipe.unet(x, t, h).sample - want).abs().max() < 1e-4, fuse


def test_a_folder_that_is_not_a_diffusers_model_is_one_line(tmp_path):
    res = run_cli("train", ROOT / "recipes" / "text-to-image.yaml", "model.from_config=null",
                  f"model.name_or_path={tmp_path}", f"backend.name={DEFAULT_BACKEND}",
                  "--output-dir", tmp_path / "run")  # fmt: skip
    assert res.returncode == 2, res.stderr[-2000:]
    assert "model_index.json" in res.stderr and "Traceback" not in res.stderr
    from ortft.core.errors import InputError
    from ortft.families.text_to_image import diffusion

    (tmp_path / "model_index.json").write_text("{}")
    with pytest.raises(InputError, match="has no unet/, vae/"):
        diffusion.check_folder(tmp_path)


def test_from_config_architecture_must_be_stable_diffusion():
    res = run_cli("validate", ROOT / "recipes" / "text-to-image.yaml",
                  "--set", "model.from_config.architecture=bert")  # fmt: skip
    assert res.returncode == 2
    assert "architecture: stable-diffusion" in res.stderr, res.stderr


def test_export_options_a_diffusers_model_has_no_graph_for_are_one_line(full_run, tmp_path):
    res = run_cli("export", full_run, "-o", tmp_path / "x", "--fp16")
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert "--fp16: not for a text-to-image model" in res.stderr
    assert not (tmp_path / "x").exists()


@pytest.mark.ort
def test_auto_probes_the_unet_and_trains_as_the_route_it_chose(tmp_path):
    """backend.name=auto: the probe times the UNet on torch and ort, then the run is the one the
    chosen route runs on its own (its probe's RNG draws undone), to the loss."""
    auto = train("text-to-image.yaml", tmp_path / "auto", "training.max_steps=2",
                 "backend.name=auto", "precision.dtype=auto")  # fmt: skip
    assert auto.returncode == 0, auto.stderr[-3000:]
    probe = json.loads((tmp_path / "auto" / "summary.json").read_text())["backend"]["probe"]
    assert {"torch", "ort"} <= set(probe["backends"])
    assert all("median_step_s" in b for b in probe["backends"].values()), probe
    fixed = train("text-to-image.yaml", tmp_path / "fixed", "training.max_steps=2",
                  f"backend.name={probe['chosen']}", f"precision.dtype={probe['dtype']}")  # fmt: skip
    assert fixed.returncode == 0, fixed.stderr[-3000:]
    assert losses(tmp_path / "auto") == losses(tmp_path / "fixed")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["adapter.rank=4", "task.ema_decay=0.9"], "task.ema_decay with adapter"),
        (["task.ema_decay=0.9", "checkpoint.final=best"], "checkpoint.final=best with task.ema"),
        (["backend.name=auto", "backend.compile=auto"], "times the eager routes only"),
    ],
)
def test_combinations_text_to_image_cannot_honour_are_recipe_errors(overrides, message):
    from ortft.core.errors import EXIT_USAGE, RecipeError
    from ortft.recipe import io as recipe_io

    path = ROOT / "recipes" / "text-to-image.yaml"
    recipe_io.load(path, overrides[:-1])  # each is refused for its last override
    with pytest.raises(RecipeError, match=message) as info:
        recipe_io.load(path, overrides)
    assert info.value.exit_code == EXIT_USAGE
