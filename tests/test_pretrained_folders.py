"""Pretrained folders of every modality, as ``save_pretrained`` writes them, train on ``ort`` and
``torch``, export with parity and predict; a folder that cannot serve the task is one line.

Each folder is built here from a tiny config (no Hub): a Whisper with its WhisperProcessor (in
both layouts: ``processor.save_pretrained``'s processor_config.json, and the Hub's
preprocessor_config.json beside the tokenizer files), what ``SentenceTransformer.save`` writes
(cls pooling, normalised: the folder's pooling must reach training and the export), what
``StableDiffusionPipeline.save_pretrained`` writes (PNDM, a feature extractor, no safety
checker), and ortft's own final/ of a ViT run. Each trains 2 steps in this process
(``lifecycle.run``): on the profile's default backend (ORT on the ort profile) with the export
on, and on torch with it off; on the ort profile the losses must agree. The
vision families' folders are the archs tier's (tests/test_archs.py, ``save_pretrained_image``).
"""

from __future__ import annotations

import contextlib
import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import (
    DEFAULT_BACKEND,
    WORDS,
    save_pretrained_classifier,
    tiny_encoder,
    tiny_image_classifier,
    tiny_speech_recognizer,
    write_image_folder,
    write_recipe,
    write_speech_jsonl,
)
from helpers import losses, summary
from test_golden_losses import REL
from typer.testing import CliRunner

from ortft.cli.app import app
from ortft.core.errors import GateError
from ortft.recipe import io as recipe_io
from ortft.run import lifecycle

# the tracer's and the ONNX exporter's warnings say nothing these tests check
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::torch.jit.TracerWarning")

ROOT = Path(__file__).resolve().parent.parent
DIGITS = ROOT / "recipes" / "data" / "digits"
STEPS = 2
KINDS = ["whisper", "sentence-transformers", "diffusers", "own-final"]


# --------------------------------------------------------------------------- the folders


def save_whisper(folder: Path, texts: list[str], hub_layout: bool) -> Path:
    """conftest's tiny Whisper (1+1 layers, d_model 32, 3 s windows) and its WhisperProcessor: the
    feature extractor and a byte-BPE Whisper tokenizer trained on ``texts``."""
    import torch
    from transformers import WhisperForConditionalGeneration, WhisperProcessor

    from ortft.backends.torch import hf_config
    from ortft.families.speech import processor as speech
    from ortft.recipe.model import FromConfig, TrainTokenizer

    tok = speech.train_tokenizer(texts, TrainTokenizer(kind="byte-bpe", vocab_size=280), "en")
    spec = FromConfig(**tiny_speech_recognizer("")["model"]["from_config"])
    config = hf_config.generic_config(spec, tok, None)
    torch.manual_seed(0)
    WhisperForConditionalGeneration(config).save_pretrained(folder)
    features = speech.feature_extractor_for(config)
    processor = WhisperProcessor(feature_extractor=features, tokenizer=tok)
    if hub_layout:  # preprocessor_config.json + the tokenizer's files, as openai/whisper-*
        processor.feature_extractor.save_pretrained(folder)
        processor.tokenizer.save_pretrained(folder)
    else:
        processor.save_pretrained(folder)
    return folder


def save_sentence_transformer(folder: Path, texts: list[str]) -> Path:
    """conftest's tiny BERT saved by ``SentenceTransformer.save`` with cls pooling, normalised,
    truncating at 24 tokens."""
    from sentence_transformers import SentenceTransformer, models

    encoder, tok = tiny_encoder(texts)
    base = folder.with_name(f"{folder.name}-encoder")
    encoder.save_pretrained(base)
    tok.save_pretrained(base)
    modules = [
        models.Transformer(str(base), max_seq_length=24),
        models.Pooling(32, pooling_mode="cls"),
        models.Normalize(),
    ]
    SentenceTransformer(modules=modules, device="cpu").save(str(folder))
    return folder


def save_stable_diffusion(folder: Path) -> Path:
    """A tiny Stable Diffusion by ``StableDiffusionPipeline.save_pretrained``: a CLIP text encoder
    (2 x 32) with a character CLIP tokenizer, a two-block UNet and VAE (latents 8x8 for 16 px),
    SD 1.x's PNDM schedule, a CLIP image processor and no safety checker."""
    import torch
    from diffusers import (
        AutoencoderKL,
        PNDMScheduler,
        StableDiffusionPipeline,
        UNet2DConditionModel,
    )
    from transformers import CLIPImageProcessor, CLIPTextConfig, CLIPTextModel

    from ortft.families.text_to_image import diffusion

    tok = diffusion.char_tokenizer(folder.with_name(f"{folder.name}-tokenizer"), 32)
    torch.manual_seed(0)
    text = CLIPTextModel(
        CLIPTextConfig(
            vocab_size=len(tok),
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=32,
            bos_token_id=tok.bos_token_id,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        )
    )
    vae = AutoencoderKL(
        block_out_channels=(16, 32),
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        latent_channels=4,
        norm_num_groups=8,
        sample_size=16,
    )
    unet = UNet2DConditionModel(
        sample_size=8,
        block_out_channels=(32, 64),
        layers_per_block=1,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=32,
        attention_head_dim=4,
        norm_num_groups=8,
    )
    scheduler = PNDMScheduler(  # Stable Diffusion 1.x's
        num_train_timesteps=1000,
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        skip_prk_steps=True,
        steps_offset=1,
        set_alpha_to_one=False,
    )
    StableDiffusionPipeline(
        vae=vae,
        text_encoder=text,
        tokenizer=tok,
        unet=unet,
        scheduler=scheduler,
        safety_checker=None,
        feature_extractor=CLIPImageProcessor(),
        requires_safety_checker=False,
    ).save_pretrained(folder)
    return folder


def save_own_final(root: Path) -> Path:
    """ortft's own final/ of a tiny ViT run (conftest's, 2 steps on torch, no export)."""
    r = tiny_image_classifier("imgs", backend="torch", max_steps=STEPS)
    r["export"] = {"enabled": False}
    path = write_recipe(root / "vit-from-config.yaml", r)
    lifecycle.run(recipe_io.load(path), output_dir=root / "vit-from-config")
    return root / "vit-from-config" / "final"


# --------------------------------------------------------------------------- the runs


def _write_data(root: Path) -> list[str]:
    """Each task's training files; the transcripts (the Whisper tokenizer is trained on them)."""
    speech = write_speech_jsonl(root / "speech.jsonl", n=16)
    rng = random.Random(0)
    pairs = []
    for _ in range(32):
        anchor = " ".join(rng.sample(WORDS, 3))
        pairs.append({"anchor": anchor, "positive": f"{anchor} {rng.choice(WORDS)}"})
    (root / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs))
    for split, n in (("train", 16), ("eval", 4)):  # image paths made absolute
        header, *rows = (DIGITS / f"{split}.csv").read_text().splitlines()[: n + 1]
        absolute = [f"{DIGITS / image},{label}" for image, label in (r.split(",") for r in rows)]
        (root / f"digits-{split}.csv").write_text("\n".join([header, *absolute]) + "\n")
    write_image_folder(root / "imgs", per_class=6)
    return [json.loads(x)["text"] for x in speech.read_text().splitlines()]


def recipe(kind: str, backend: str, folder: Path, export: bool = False) -> dict[str, Any]:
    """2 steps of ``kind`` on ``folder``; the exported run has no eval."""
    task: dict[str, Any]
    if kind == "whisper":
        task = {"name": "speech-recognition", "max_target_length": 24, "generate_samples": 2}
        data: dict[str, Any] = {"train": "speech.jsonl", "eval_fraction": 0.25}
    elif kind == "sentence-transformers":
        task = {"name": "sentence-embedding"}
        data = {"train": "pairs.jsonl", "eval_fraction": 0.25, "max_length": 24}
    elif kind == "diffusers":
        task = {
            "name": "text-to-image",
            "caption_template": "a handwritten digit {label}",
            "resolution": 16,
        }
        # an eval on ORT is a second ORTModule export of the UNet: torch's run evaluates
        data = {"train": "digits-train.csv", "eval_fraction": 0.0}
        if not export:
            data["eval"] = "digits-eval.csv"
    else:
        task = {"name": "image-classification"}
        data = {"train": "imgs", "eval_fraction": 0.25}
    model: dict[str, Any] = {"name_or_path": str(folder)}
    if kind != "diffusers":
        model["dropout"] = 0.0
    return {
        "model": model,
        "task": task,
        "data": data,
        "training": {"max_steps": STEPS, "batch_size": 4, "lr": 1e-3, "log_every": 1},
        "backend": {"name": backend},
        "export": {"enabled": export},
    }


# the run each kind exports: on the default backend (ort on the ort profile); the other run
# trains on torch with the export off
EXPORTED = "exported"


class Runs:
    """Each folder built and each (kind, EXPORTED or "torch") trained once, in this process,
    when a test first asks for it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.texts = _write_data(root)
        self.folders: dict[str, Path] = {}
        self.runs: dict[tuple[str, str], Path] = {}
        self.errors: dict[tuple[str, str], str] = {}

    def folder(self, name: str) -> Path:
        if name not in self.folders:
            where = self.root / name
            if name.startswith("whisper"):
                save_whisper(where, self.texts, hub_layout=name == "whisper-hub")
            elif name == "sentence-transformers":
                save_sentence_transformer(where, WORDS)
            elif name == "diffusers":
                save_stable_diffusion(where)
            else:
                where = save_own_final(self.root)
            self.folders[name] = where
        return self.folders[name]

    def run(self, kind: str, which: str) -> Path:
        """The run dir; Whisper's torch run reads the Hub layout, its exported run the other."""
        key = (kind, which)
        if key in self.errors:  # failed once: the kind's other tests fail without retraining
            pytest.fail(self.errors[key])
        if key not in self.runs:
            name = "whisper-hub" if key == ("whisper", "torch") else kind
            out = self.root / f"{kind}-{which}"
            exported = which == EXPORTED
            backend = DEFAULT_BACKEND if exported else "torch"
            try:
                path = write_recipe(
                    self.root / f"{kind}-{which}.yaml",
                    recipe(kind, backend, self.folder(name), export=exported),
                )
                # a failed parity gate ends a finished run: test_export_passes_parity says which
                with contextlib.suppress(GateError):
                    lifecycle.run(recipe_io.load(path), output_dir=out)
            except (Exception, SystemExit) as err:
                self.errors[key] = f"{kind} on {backend}: {type(err).__name__}: {err}"
                raise
            self.runs[key] = out
        return self.runs[key]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return Runs(tmp_path_factory.mktemp("pretrained"))


# --------------------------------------------------------------------------- train, export


@pytest.mark.ort
@pytest.mark.parametrize("kind", KINDS)
def test_trains_on_ort_like_torch(kind: str, runs: Runs) -> None:
    ort, torch = runs.run(kind, EXPORTED), runs.run(kind, "torch")
    got = summary(ort)
    assert got["status"] == "completed" and got["steps"] == STEPS, got["error"]
    assert got["backend"]["used"] == "ort" and not got["backend"]["fallback"], got["backend"]
    assert summary(torch)["status"] == "completed"
    assert losses(ort) == pytest.approx(losses(torch), rel=REL)


@pytest.mark.parametrize("kind", KINDS)
def test_export_passes_parity(kind: str, runs: Runs) -> None:
    report = summary(runs.run(kind, EXPORTED))["export"]
    assert report is not None and report["passed"], report and report.get("failures")


def test_the_sentence_transformers_pooling_reaches_training_export_and_final(runs: Runs):
    """The folder's cls pooling, normalised, 24 tokens: not ortft's default (mean, plain)."""
    from ortft.families.embedding import pooling

    run = runs.run("sentence-transformers", EXPORTED)
    report = json.loads((run / "onnx" / "export.json").read_text())
    assert (report["pooling"]["mode"], report["pooling"]["normalize"]) == ("cls", True)
    got = pooling.read(run / "final")
    assert (got.mode, got.normalize, got.max_seq_length) == ("cls", True, 24), got


def test_own_final_keeps_its_head(runs: Runs) -> None:
    """final/ of an image run holds the data's labels: the head is kept, not started afresh."""
    head = summary(runs.run("own-final", EXPORTED))["backend"]["head"]
    assert head["action"] == "kept" and head["new_labels"] == ["cat", "dog", "fox"], head


# --------------------------------------------------------------------------- predict


def _predict(source: Path, inputs: Path, **kw: Any) -> list[dict[str, Any]]:
    from ortft.inference import predict

    return list(predict.run(source, str(inputs), **kw))


def test_whisper_predicts_the_same_transcripts_on_both_runtimes(runs: Runs) -> None:
    clips = runs.root / "clips.txt"
    rows = (runs.root / "speech.jsonl").read_text().splitlines()[:3]
    clips.write_text("".join(json.loads(r)["audio"] + "\n" for r in rows))
    run = runs.run("whisper", EXPORTED)
    final = _predict(run / "final", clips, max_new_tokens=6)
    export = _predict(run / "onnx", clips, max_new_tokens=6)
    assert [r["text"] for r in export] == [r["text"] for r in final] and len(final) == 3
    hub = _predict(runs.run("whisper", "torch") / "final", clips, max_new_tokens=6)
    assert all(isinstance(r["text"], str) for r in hub) and len(hub) == 3


def test_sentence_transformers_predicts_the_same_embeddings(runs: Runs) -> None:
    texts = runs.root / "texts.txt"
    texts.write_text("the cat sat\ndogs ran in parks\nbirds sang\n")
    run = runs.run("sentence-transformers", EXPORTED)
    final = np.array([r["embedding"] for r in _predict(run / "final", texts)])
    export = np.array([r["embedding"] for r in _predict(run / "onnx", texts)])
    assert final.shape == (3, 32)
    np.testing.assert_allclose(np.linalg.norm(final, axis=1), 1.0, atol=1e-5)  # normalised
    np.testing.assert_allclose(export, final, atol=1e-5, rtol=0)
    torch_final = _predict(runs.run("sentence-transformers", "torch") / "final", texts)
    assert len(torch_final) == 3


def test_own_final_predicts_the_same_labels(runs: Runs) -> None:
    run, images = runs.run("own-final", EXPORTED), runs.root / "imgs"
    final, export = _predict(run / "final", images), _predict(run / "onnx", images)
    assert len(final) == 18 and [r["label"] for r in export] == [r["label"] for r in final]
    for got, want in zip(export, final, strict=True):
        assert got["scores"] == pytest.approx(want["scores"], abs=1e-4)


def _cli(*args: object) -> Any:
    """``ortft ARGS`` in this process; a traceback the CLI let through is raised."""
    res = CliRunner().invoke(app, [str(a) for a in args])
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise res.exception
    return res


def test_diffusers_folder_draws_on_both_runtimes(runs: Runs) -> None:
    """With the folder's own PNDM scheduler (the numpy loop against diffusers, from the same
    latents: tests/test_text_to_image.py)."""
    from PIL import Image

    for which, folder, runtime in (
        (EXPORTED, "onnx", "onnxruntime"),
        ("torch", "final", "pytorch"),
    ):
        out = runs.root / f"diffusers-{which}-{folder}.png"
        source = runs.run("diffusers", which) / folder
        res = _cli("predict", source, "--prompt", "a digit 3", "--steps", 2, "-o", out, "--json")
        assert res.exit_code == 0, res.stderr[-2000:]
        drawn = json.loads(res.stdout)
        assert (drawn["runtime"], drawn["scheduler"]) == (runtime, "PNDMScheduler"), drawn
        assert Image.open(out).size == (16, 16)


# --------------------------------------------------------------------------- folders that cannot serve


def _without(source: Path, folder: Path, *names: str) -> Path:
    """A copy of ``source`` without the files ``names`` (its processor's)."""
    import shutil

    shutil.copytree(source, folder, ignore=shutil.ignore_patterns(*names))
    return folder


BAD = [  # (folder, task's kind, what the one line says)
    (
        "bert",
        "own-final",
        "holds a bert model (BertForSequenceClassification), a text model (input_ids); "
        "image-classification needs an image model",
    ),
    (
        "vit",
        "whisper",
        "holds a vit model (ViTForImageClassification), an image model (pixel_values); "
        "speech-recognition needs an audio model",
    ),
    (
        "whisper",
        "sentence-transformers",
        "holds a whisper model (WhisperForConditionalGeneration), an audio model "
        "(input_features); sentence-embedding needs a text model",
    ),
    (
        "vit-no-processor",
        "own-final",
        "has no preprocessor_config.json (an image model needs its image processor)",
    ),
    (
        "whisper-no-processor",
        "whisper",
        "has no processor_config.json or preprocessor_config.json (a speech model needs its "
        "feature extractor)",
    ),
    ("vit", "diffusers", "has no model_index.json (text-to-image needs a diffusers model folder"),
    (
        "diffusers",
        "own-final",
        "is not a model directory (no config.json but model_index.json: a diffusers pipeline, "
        "for text-to-image)",
    ),
]


@pytest.mark.parametrize("name,kind,says", BAD, ids=[f"{n}-for-{k}" for n, k, _ in BAD])
def test_a_folder_that_cannot_serve_the_task_is_one_line(runs, name, kind, says, tmp_path):
    if name == "bert":
        folder = save_pretrained_classifier(tmp_path / "bert", WORDS)
    elif name == "vit":
        folder = runs.folder("own-final")
    elif name == "vit-no-processor":
        folder = _without(runs.folder("own-final"), tmp_path / name, "preprocessor_config.json")
    elif name == "whisper-no-processor":
        folder = _without(runs.folder("whisper"), tmp_path / name, "processor_config.json")
    else:
        folder = runs.folder(name)
    path = write_recipe(runs.root / f"bad-{name}-{kind}.yaml", recipe(kind, "torch", folder))
    res = _cli("train", path, "--output-dir", tmp_path / "run")
    assert res.exit_code == 2, res.stderr[-2000:]
    lines = [x for x in res.stderr.splitlines() if x.startswith("error:")]
    assert lines == res.stderr.splitlines()[-1:], res.stderr[-2000:]
    assert str(folder) in lines[0] and says in lines[0], lines[0]


def test_a_folder_the_task_has_no_class_for_is_one_line(tmp_path: Path) -> None:
    """A text model of a type the task's auto class lacks (a BERT for seq2seq): named, before
    transformers' "Unrecognized configuration class" after the data is tokenized."""
    from types import SimpleNamespace

    from ortft.backends.torch import load_checks
    from ortft.core.errors import InputError

    folder = save_pretrained_classifier(tmp_path / "bert", WORDS)
    seq2seq = SimpleNamespace(name="seq2seq", auto_class="AutoModelForSeq2SeqLM", modality="text")
    with pytest.raises(InputError) as err:
        load_checks.check_fits(str(folder), seq2seq, trust_remote_code=False)
    assert str(err.value) == (
        f"model.name_or_path: {folder} holds a bert model (BertForSequenceClassification); "
        "seq2seq builds an AutoModelForSeq2SeqLM, and transformers has none for bert"
    )
    classify = SimpleNamespace(
        name="sequence-classification",
        auto_class="AutoModelForSequenceClassification",
        modality="text",
    )
    load_checks.check_fits(str(folder), classify, trust_remote_code=False)  # fits: no error
