"""The image classifier's export (``ortft.families.vision.graphs``): ``model.onnx`` on
pixel_values with its parity, ``preprocess.onnx`` checked against the image processor (a broken
one fails the export into ``onnx.failed/``), the folder a client needs (processor, id2label, a
card whose snippet runs), ``ortft export`` of a run and of a checkpoint, and ``final/`` in
transformers' pipeline.

One tiny ViT (2 layers, hidden 32, 8x8 images) trains once for the module (~15 s); the other
exports run in-process on it (~3 s each).
"""

from __future__ import annotations

import ast
import copy
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import tiny_image_classifier, write_image_folder, write_recipe
from helpers import run_cli
from typer.testing import CliRunner

from ortft.cli.app import app
from ortft.core.errors import GateError
from ortft.data import images
from ortft.export import deploy, parity
from ortft.families.vision import graphs as image
from ortft.families.vision import preprocess as image_preprocess
from ortft.families.vision import processor as processors
from ortft.tools.export_source import export_source

CLASSES = ("cat", "dog", "fox")
SIZE = 8  # tiny_image_classifier's image_size


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("export-image")
    recipe = tiny_image_classifier(str(write_image_folder(tmp / "imgs", classes=CLASSES)), "torch")
    recipe["checkpoint"] = {"save_every": 2}
    res = run_cli("train", write_recipe(tmp / "r.yaml", recipe), "-o", tmp / "run")
    assert res.returncode == 0, res.stderr[-3000:]
    failed = tmp / "run" / "onnx.failed" / "export.json"  # a failed check: not in its gates
    assert not failed.exists(), json.loads(failed.read_text())["failures"]
    return tmp / "run"


def _report(folder: Path) -> dict:
    return json.loads((folder / "export.json").read_text())


def write_image_modes(folder: Path) -> list[Path]:
    """One small image per kind of file to_rgb converts (alpha, palette, 16-bit, gray...)."""
    from PIL import Image

    folder.mkdir(exist_ok=True)
    rng = np.random.default_rng(1)
    rgba = rng.integers(0, 256, (13, 9, 4), dtype=np.uint8)
    rgba[..., 3] = np.where(rng.random((13, 9)) < 0.5, 0, rgba[..., 3])  # see-through pixels
    made = {
        "rgba.png": Image.fromarray(rgba),  # the mode follows the array: RGBA, LA, L, I;16
        "la.png": Image.fromarray(np.ascontiguousarray(rgba[..., [0, 3]])),
        "gray.png": Image.fromarray(np.ascontiguousarray(rgba[..., 0])),
        "wide.png": Image.fromarray(rgba[..., 0].astype(np.uint16) * 257),
        "cmyk.jpg": Image.fromarray(rgba).convert("CMYK"),
        "big.png": Image.fromarray(rng.integers(0, 256, (40, 31, 3), dtype=np.uint8)),
    }
    palette = Image.fromarray(rgba[..., :3]).convert("P", palette=Image.Palette.ADAPTIVE)
    palette.info["transparency"] = 0
    made["palette.png"] = palette
    for name, img in made.items():
        img.save(folder / name, **({"transparency": 0} if name == "palette.png" else {}))
    return sorted(folder / name for name in made)


# --------------------------------------------------------------------------- model.onnx


def test_model_onnx_takes_pixel_values_and_passes_parity(run: Path) -> None:
    import onnx

    report = _report(run / "onnx")
    p = report["parity"]
    assert report["passed"] and report["failures"] == [], report["failures"]
    assert p["source"] == "eval data" and p["samples"] == 6  # 24 images, eval_fraction 0.25
    assert p["max_abs_diff"] <= p["tolerance"] == 1e-4 and p["prediction_agreement"] == 1.0
    assert report["inputs"] == ["pixel_values"] and report["outputs"] == ["logits"]
    graph = onnx.load(str(run / "onnx" / "model.onnx")).graph
    dims = lambda v: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]  # noqa: E731
    assert [dims(i) for i in graph.input] == [["batch", 3, SIZE, SIZE]]
    assert graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert [dims(o) for o in graph.output] == [["batch", len(CLASSES)]]
    x = np.random.default_rng(0).standard_normal((5, 3, SIZE, SIZE)).astype(np.float32)
    (logits,) = parity.session(run / "onnx" / "model.onnx").run(None, {"pixel_values": x})
    assert logits.shape == (5, len(CLASSES))  # any batch
    # what a client reads: the names, the processor (PIL backend), no tokenizer
    config = json.loads((run / "onnx" / "config.json").read_text())
    assert sorted(config["id2label"].values()) == list(CLASSES)
    saved = json.loads((run / "onnx" / "preprocessor_config.json").read_text())
    assert saved["size"] == {"height": SIZE, "width": SIZE}
    assert report["preprocessor"]["backend"] == "pil" and "tokenizer" not in report
    assert not (run / "onnx" / "tokenizer.json").exists()


def test_preprocess_onnx_is_checked_against_the_processor(run: Path) -> None:
    report = _report(run / "onnx")
    pre = report["preprocess"]
    assert report["files"]["preprocess"] == "preprocess.onnx" and pre["exported"] and pre["passed"]
    assert pre["images"] == report["parity"]["samples"] and pre["source"] == "eval data"
    assert pre["max_abs_diff"] <= pre["tolerance"]
    step = (1 / 255) / 0.5  # one 8-bit pixel step, normalised (mean = std = 0.5)
    assert pre["tolerance"] == pytest.approx(image_preprocess.TOL_LSB * step, rel=1e-3)
    sess = parity.session(run / "onnx" / "preprocess.onnx")
    (inp,), (out,) = sess.get_inputs(), sess.get_outputs()
    assert (inp.name, inp.type, inp.shape) == ("image", "tensor(uint8)", ["height", "width", 3])
    assert (out.name, out.shape) == ("pixel_values", [1, 3, SIZE, SIZE])
    e2e = report["end_to_end"]  # the two graphs as a client runs them, against PyTorch
    assert e2e["images"] == pre["images"] and not e2e["gated"] and e2e["max_abs_diff"] < 1e-2


def _skip_normalize(monkeypatch: pytest.MonkeyPatch) -> None:
    """preprocess.onnx built for the processor without its normalisation (a builder bug); it
    is still checked against the real one."""
    build = image_preprocess.build

    def broken(processor, path, **kw):
        unnormalised = copy.deepcopy(processor)
        unnormalised.do_normalize = False
        return build(unnormalised, path, **kw)

    monkeypatch.setattr(image_preprocess, "build", broken)


def test_a_broken_preprocess_fails_the_export(
    run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _skip_normalize(monkeypatch)
    out = tmp_path / "onnx"
    with pytest.raises(GateError, match=r"preprocess\.onnx: max \|diff\|"):
        export_source(run, out, opset=20, tolerance=1e-4)
    assert not out.exists()
    failed = _report(tmp_path / "onnx.failed")
    assert not failed["passed"] and failed["parity"]["passed"]  # model.onnx itself is fine
    assert [f.split(":")[0] for f in failed["failures"]] == ["preprocess.onnx"]
    assert failed["preprocess"]["max_abs_diff"] > 0.5  # x/255 where (x/255 - 0.5)/0.5 was due


def test_a_processor_the_graph_cannot_express_gets_model_onnx_alone(
    run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """A LANCZOS resize (no ONNX Resize mode): model.onnx alone, export.json says why, and the
    card's snippet runs the image processor instead (here, in this venv: transformers)."""
    model = shutil.copytree(run / "final", tmp_path / "model")
    config = json.loads((model / "preprocessor_config.json").read_text())
    (model / "preprocessor_config.json").write_text(json.dumps({**config, "resample": 1}))
    report = export_source(model, tmp_path / "onnx", opset=20, tolerance=1e-4)
    assert report["passed"] and "preprocess" not in report["files"]
    assert report["preprocess"] == {
        "exported": False,
        "reason": image_preprocess.supported_problem(processors.from_folder(str(model))),
    }
    assert "LANCZOS" in report["preprocess"]["reason"] and "end_to_end" not in report
    assert not (tmp_path / "onnx" / "preprocess.onnx").exists()
    code = deploy.card_snippet((tmp_path / "onnx" / "README.md").read_text())
    assert 'AutoImageProcessor.from_pretrained(".", backend="pil")' in code
    write_image_modes(tmp_path / "modes")
    shutil.copy(tmp_path / "modes" / "big.png", tmp_path / "onnx" / image.CARD_IMAGE)
    (want,) = _predict(tmp_path / "onnx", tmp_path / "onnx" / image.CARD_IMAGE)
    monkeypatch.chdir(tmp_path / "onnx")
    capsys.readouterr()
    exec(compile(code, "card", "exec"), {"__name__": "__main__"})
    assert capsys.readouterr().out == want["label"] + "\n"


# --------------------------------------------------------------------------- ortft export


def test_export_of_a_checkpoint_with_variants(run: Path, tmp_path: Path) -> None:
    """A checkpoint (config and processor from the run's final/) with --optimize and --fp16:
    single-graph variants, judged as for text."""
    out = tmp_path / "onnx"
    report = export_source(
        run / "step-000002", out, opset=20, tolerance=1e-4, optimize=True, fp16=True
    )
    assert report["passed"] and report["dir"] == str(out)
    assert report["files"]["optimized"] == "model.opt.onnx" and report["fp16"]["passed"]
    assert report["optimize"]["max_abs_diff"] <= 1e-4 and report["preprocess"]["passed"]
    final = _report(run / "onnx")["parity"]
    assert report["parity"]["samples"] == final["samples"]  # the recipe's eval images
    # int8 leaves the patch embedding's Conv float (ORT 1.19 has no CPU ConvInteger kernel)
    q = export_source(run, tmp_path / "q", opset=20, tolerance=1e-4, quantize="int8")
    assert q["passed"] and q["int8"]["passed"], q.get("failures")
    assert "Conv" not in q["int8"]["op_types"]


# --------------------------------------------------------------------------- clients


def _predict(source: Path, inputs: Path) -> list[dict]:
    res = CliRunner().invoke(app, ["predict", str(source), "-i", str(inputs), "--json"])
    assert res.exit_code == 0, res.stderr + str(res.exception)
    return [json.loads(x) for x in res.stdout.splitlines()]


def test_card_snippet_decodes_like_ortft(
    run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """The card's ``to_rgb`` converts every kind of file as ``images.to_rgb`` does, and the
    snippet, run verbatim beside an image, prints the label ``ortft predict`` gives."""
    from PIL import Image

    code = deploy.card_snippet((run / "onnx" / "README.md").read_text())
    scope = {"np": np, "Image": Image}
    defs = [n for n in ast.parse(code).body if isinstance(n, ast.FunctionDef)]  # to_rgb
    exec(compile(ast.Module(defs, []), "card", "exec"), scope)
    files = write_image_modes(tmp_path / "modes")
    for path in files:
        with Image.open(path) as img:
            want = np.asarray(images.to_rgb(img))
            assert np.array_equal(np.asarray(scope["to_rgb"](img)), want), path.name
    folder = shutil.copytree(run / "onnx", tmp_path / "onnx")
    shutil.copy(tmp_path / "modes" / "rgba.png", folder / image.CARD_IMAGE)
    (want,) = _predict(run / "onnx", folder / image.CARD_IMAGE)
    monkeypatch.chdir(folder)  # run from the folder, as the card says (in-process: the
    capsys.readouterr()  # main venv's onnxruntime-training takes ~8 s to import in a new one)
    exec(compile(code, "card", "exec"), {"__name__": "__main__"})
    assert capsys.readouterr().out == want["label"] + "\n"


def test_final_loads_in_the_transformers_pipeline(run: Path) -> None:
    """``final/`` in ``pipeline("image-classification")`` gives ortft's label and scores (the
    pipeline's processor is the PIL one here: torchvision is not installed, see processors)."""
    from transformers import pipeline

    files = sorted((run.parent / "imgs").rglob("*.png"))[::5]
    classify = pipeline("image-classification", model=str(run / "final"))
    assert getattr(classify.image_processor, "backend", None) == "pil"
    listing = run.parent / "some.txt"
    listing.write_text("".join(f"{f.relative_to(run.parent)}\n" for f in files))
    for got, want in zip(classify([str(f) for f in files], top_k=None), _predict(run, listing),
                         strict=True):  # fmt: skip
        assert got[0]["label"] == want["label"]
        assert {g["label"]: g["score"] for g in got} == pytest.approx(want["scores"], abs=1e-5)


def test_a_failed_preprocess_check_fails_the_run_as_a_gate() -> None:
    """`ortft train` turns export.json's preprocess check into a gate (exit 3 on failure), as
    it does parity and the generation check."""
    from ortft.run.gates import export_checks

    bad = {"exported": True, "passed": False, "max_abs_diff": 1.6e-2, "tolerance": 7.8e-3}
    (result,) = export_checks({"preprocess": bad})
    assert not result.passed and "1.60e-02 > 7.80e-03" in (result.reason or "")
    (result,) = export_checks({"preprocess": {**bad, "passed": True}})
    assert result.passed
    assert export_checks({"preprocess": {"exported": False, "reason": "LANCZOS"}}) == []
    assert export_checks({}) == []  # a text export has no preprocess graph
