"""`ortft predict` and `ortft eval` of an image classifier: inputs, bad files, runtimes.

No training: a tiny untrained ViT saved as Hugging Face saves one (config.json with 6 labels,
model.safetensors, the PIL image processor's preprocessor_config.json), which ortft reads as a
plain model folder (task from the architecture). Its ONNX folder is model.onnx alone (no
preprocess.onnx): predict falls back to the processor, so both runtimes see the same pixels.
The trained run, its full export and preprocess.onnx are in tests/test_task_matrix.py.
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import write_image_folder
from helpers import run_cli
from typer.testing import CliRunner

from ortft.cli.app import app

LABELS = tuple("abcdef")  # more than 5: top-5 accuracy is scored


def invoke(*args: object, input: str | bytes | None = None):
    return CliRunner().invoke(app, [str(a) for a in args], input=input)


def predictions(res) -> list[dict]:
    assert res.exit_code == 0, res.stderr + str(res.exception)
    return [json.loads(line) for line in res.stdout.splitlines()]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import ViTConfig, ViTForImageClassification

    from ortft.families.vision import processor as processors

    folder = tmp_path_factory.mktemp("vit")
    config = ViTConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        image_size=8,
        patch_size=4,
        id2label=dict(enumerate(LABELS)),
        label2id={n: i for i, n in enumerate(LABELS)},
    )
    torch.manual_seed(0)
    ViTForImageClassification(config).eval().save_pretrained(folder)
    processors.for_config(config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def onnx_dir(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """model.onnx (pixel_values -> logits, dynamic batch), config, processor, export.json."""
    from transformers import ViTForImageClassification

    folder = tmp_path_factory.mktemp("vit-onnx")
    for name in ("config.json", "preprocessor_config.json"):
        shutil.copy(model_dir / name, folder / name)
    (folder / "export.json").write_text(json.dumps({"task": "image-classification"}))
    model = ViTForImageClassification.from_pretrained(model_dir).eval()

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
            return self.model(pixel_values=pixel_values, return_dict=True).logits

    from ortft.export.onnx_tools import standard_symbolics

    # standard_symbolics: an ORTModule built earlier in this process (test_images.py) left its
    # ATen symbolics registered, and a graph exported with them (an ATen LayerNorm) does not
    # load in a plain onnxruntime; warnings: the tracer's notes on ViT's shape checks
    with warnings.catch_warnings(), standard_symbolics():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            Logits(),
            (torch.zeros(1, 3, 8, 8),),
            str(folder / "model.onnx"),
            input_names=["pixel_values"],
            output_names=["logits"],
            dynamic_axes={"pixel_values": {0: "batch"}, "logits": {0: "batch"}},
            dynamo=False,
        )
    return folder


@pytest.fixture(scope="module")
def imgs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """6 classes x 3 PNGs of 10x12 (resized to 8x8), plus what a folder input leaves out."""
    root = write_image_folder(tmp_path_factory.mktemp("data") / "imgs", 3, LABELS)
    (root / "a" / "notes.txt").write_text("not an image\n")
    (root / "a" / ".hidden.png").write_bytes((root / "a" / "000.png").read_bytes())
    (root / ".cache").mkdir()
    (root / ".cache" / "x.png").write_bytes((root / "a" / "000.png").read_bytes())
    return root


def test_list_file_paths_are_relative_to_it(model_dir: Path, imgs: Path) -> None:
    listing = imgs.parent / "paths.txt"  # the working directory is elsewhere (the repo)
    listing.write_text("imgs/b/001.png\n\n   \n  imgs/a/000.png \nimgs/f/002.png")
    got = predictions(invoke("predict", model_dir, "-i", listing, "--json"))
    assert [r["index"] for r in got] == [0, 1, 2]
    assert [r["input"] for r in got] == ["imgs/b/001.png", "imgs/a/000.png", "imgs/f/002.png"]
    for r in got:
        assert set(r["scores"]) == set(LABELS) and sum(r["scores"].values()) == pytest.approx(1)
        assert r["top_k"][0] == [r["label"], r["score"]] and len(r["top_k"]) == 5
        assert [p for _, p in r["top_k"]] == sorted(r["scores"].values(), reverse=True)[:5]
    plain = invoke("predict", model_dir, "-i", listing)  # path, label, score
    assert (
        plain.stdout.splitlines()[0] == f"imgs/b/001.png\t{got[0]['label']}\t{got[0]['score']:.4f}"
    )


def test_folder_is_every_image_sorted_recursively(model_dir: Path, imgs: Path) -> None:
    got = predictions(invoke("predict", model_dir, "-i", imgs, "--json"))
    want = [str(imgs / c / f"{i:03d}.png") for c in LABELS for i in range(3)]
    assert [r["input"] for r in got] == want  # no notes.txt, no hidden file or folder
    listing = imgs.parent / "all.txt"
    listing.write_text("\n".join(want))
    same = predictions(invoke("predict", model_dir, "-i", listing, "--json"))
    assert [r["scores"] for r in same] == [r["scores"] for r in got]
    one = predictions(invoke("predict", model_dir, "-i", want[4], "--json"))  # one image file
    assert one[0]["scores"] == pytest.approx(got[4]["scores"], abs=1e-6)  # batch of 1, not 16


def test_onnx_without_preprocess_graph_matches_pytorch(
    model_dir: Path, onnx_dir: Path, imgs: Path
) -> None:
    want = predictions(invoke("predict", model_dir, "-i", imgs, "--json"))
    got = predictions(invoke("predict", onnx_dir, "-i", imgs, "--json"))
    assert [g["label"] for g in got] == [w["label"] for w in want]
    for g, w in zip(got, want, strict=True):
        assert g["scores"] == pytest.approx(w["scores"], abs=1e-6)


def _truncated(path: Path, imgs: Path) -> None:
    data = (imgs / "a" / "000.png").read_bytes()
    path.write_bytes(data[: len(data) // 2])


BAD = {  # what a listed file is -> the reason printed
    "missing": (lambda path, imgs: None, "file not found"),
    "not-an-image": (lambda path, imgs: path.write_text("hello\n"), "not an image Pillow can read"),
    "truncated": (_truncated, "image file is truncated"),
}


@pytest.mark.parametrize("kind", list(BAD))
def test_bad_file_is_one_line_naming_it(model_dir: Path, imgs: Path, kind: str) -> None:
    make, reason = BAD[kind]
    bad = Path("bad") / f"{kind}.png"  # as the list names it, relative to the list
    (imgs.parent / "bad").mkdir(exist_ok=True)
    make(imgs.parent / bad, imgs)
    listing = imgs.parent / f"{kind}.txt"
    listing.write_text(f"imgs/a/000.png\n{bad}\n")
    res = invoke("predict", model_dir, "-i", listing, "--json")
    assert res.exit_code == 2, res.stderr + str(res.exception)
    assert res.stdout == ""  # every file is checked before the first prediction
    assert res.stderr == f"error: {listing}:2: {bad}: {reason}\n"  # one line


def test_bad_file_in_a_folder_names_it(model_dir: Path, imgs: Path) -> None:
    folder = imgs.parent / "with-bad"
    shutil.copytree(imgs / "a", folder / "a")
    (folder / "b").mkdir()
    _truncated(folder / "b" / "zz.png", imgs)
    res = invoke("predict", model_dir, "-i", folder)
    assert res.exit_code == 2 and res.stdout == ""
    assert res.stderr == f"error: {folder / 'b' / 'zz.png'}: image file is truncated\n"


def test_unreadable_inputs_are_one_line(model_dir: Path, imgs: Path) -> None:
    png = imgs / "a" / "000.png"
    (imgs.parent / "empty").mkdir(exist_ok=True)
    for args, inp, want in (
        (["-i", imgs.parent / "nope.txt"], None, "input file or folder not found"),
        (["-i", "-"], png.read_bytes(), "<stdin>: not a text file of image paths"),
        (["-i", imgs.parent / "empty"], None, "no image files"),
    ):
        res = invoke("predict", model_dir, *args, input=inp)
        assert res.exit_code == 2 and res.stdout == "", (args, res.stderr)
        assert want in res.stderr and res.stderr.count("\n") == 1, (args, res.stderr)


def test_an_image_piped_to_stdin_is_one_line(model_dir: Path, imgs: Path) -> None:
    """A real process: its stdin decodes bytes that are not UTF-8 to surrogates, no error."""
    with open(imgs / "a" / "000.png", "rb") as fh:
        res = run_cli("predict", model_dir, timeout=120, stdin=fh, env={"NO_COLOR": "1"})
    assert res.returncode == 2 and res.stdout == "", res.stderr
    assert res.stderr.splitlines()[-1].startswith("error: <stdin>: not a text file"), res.stderr


def test_eval_on_a_folder_scores_as_training_does(model_dir: Path, onnx_dir: Path) -> None:
    """--data a folder of class sub-folders: accuracy, f1, top-5 and the mean loss the model
    itself computes on the processor's pixel_values; its ONNX export gives the same."""
    from transformers import ViTForImageClassification

    from ortft.data import images
    from ortft.families.vision import processor as processors

    data = write_image_folder(model_dir.parent / "eval-imgs", 2, LABELS, seed=1)
    got = json.loads(invoke("eval", model_dir, "--data", data, "--json").stdout)
    assert got["task"] == "image-classification" and got["examples"] == 12
    files = sorted(data.glob("*/*.png"))
    gold = torch.tensor([LABELS.index(f.parent.name) for f in files])
    pixels = images.pixel_values(
        [images.load(str(f)) for f in files], processors.from_folder(str(model_dir))
    )
    model = ViTForImageClassification.from_pretrained(model_dir).eval()
    with torch.no_grad():
        out = model(pixel_values=torch.from_numpy(pixels), labels=gold)
    top5 = out.logits.topk(5).indices == gold[:, None]
    want = {
        "loss": float(out.loss),
        "accuracy": float((out.logits.argmax(-1) == gold).float().mean()),
        "top5_accuracy": float(top5.any(-1).float().mean()),
    }
    assert {k: got["metrics"][k] for k in want} == pytest.approx(want, rel=1e-5)
    assert set(got["metrics"]) == {"loss", "accuracy", "f1_macro", "top5_accuracy"}
    onnx = json.loads(invoke("eval", onnx_dir, "--data", data, "--json").stdout)
    assert onnx["runtime"] == "onnxruntime"
    assert onnx["metrics"] == pytest.approx(got["metrics"], rel=1e-5, abs=1e-6)
    assert np.isfinite(list(got["metrics"].values())).all()
