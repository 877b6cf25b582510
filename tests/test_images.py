"""Images in the data path: bad files (error / skip), conversions to RGB and their counts, the
seeded augmentation, and ORT training a ViT like PyTorch with its patch embedding in ORT."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import tiny_image_classifier, write_image_folder, write_recipe
from helpers import losses, run_cli, summary
from PIL import Image

from ortft import tasks
from ortft.data import images

# --------------------------------------------------------------------------- unit: files


def _truncated_png(path: Path) -> Path:
    Image.fromarray(np.full((32, 32, 3), 7, np.uint8)).save(path.with_suffix(".full.png"))
    data = path.with_suffix(".full.png").read_bytes()
    path.with_suffix(".full.png").unlink()
    path.write_bytes(data[: len(data) // 2])  # the header is whole: open() succeeds, load() not
    return path


def test_check_names_what_is_wrong_with_a_file(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not an image")
    cases = {
        str(tmp_path / "absent.png"): "file not found",
        str(tmp_path / "notes.txt"): "not an image Pillow can read",
        str(_truncated_png(tmp_path / "cut.png")): "truncated",
    }
    for path, reason in cases.items():
        with pytest.raises(images.BadImage, match=reason):
            images.check(path)
    good = tmp_path / "good.png"
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(good)
    assert images.check(str(good)) == "RGB"


def test_every_mode_becomes_8_bit_rgb() -> None:
    gray = Image.fromarray(np.array([[0, 128], [255, 3]], np.uint8), mode="L")
    assert np.array_equal(np.asarray(images.to_rgb(gray))[..., 1], np.asarray(gray))
    wide = Image.fromarray(np.array([[0, 65535], [32768, 257]], np.uint16))  # I;16
    assert wide.mode.startswith("I")
    assert np.asarray(images.to_rgb(wide))[..., 0].tolist() == [[0, 255], [128, 1]]
    rgba = Image.fromarray(np.array([[[200, 0, 0, 0], [200, 0, 0, 255]]], np.uint8), "RGBA")
    # transparent -> white, as transformers' convert_rgb composites; opaque stays
    assert np.asarray(images.to_rgb(rgba)).tolist() == [[[255, 255, 255], [200, 0, 0]]]
    pal = gray.convert("P")
    assert images.to_rgb(pal).mode == "RGB"
    pal.info["transparency"] = 0
    assert images.to_rgb(pal).mode == "RGB"


def test_collate_augments_train_batches_by_seed_epoch_and_file(tmp_path: Path) -> None:
    write_image_folder(tmp_path / "imgs", per_class=2, size=(16, 20))
    paths = sorted(str(p).encode() for p in (tmp_path / "imgs").rglob("*.png"))
    batch = {"_image": np.array(paths, dtype="S"), "labels": np.zeros(len(paths), np.int64)}
    task = tasks.get("image-classification", {"random_resized_crop": True, "horizontal_flip": True})
    from transformers.models.vit import ViTImageProcessorPil

    task.bind(ViTImageProcessorPil(size={"height": 8, "width": 8}))
    plain = task.collate(batch, None, 0)["pixel_values"]  # eval: never augmented
    assert np.array_equal(plain, task.collate(batch, None, 0)["pixel_values"])
    e0 = task.collate(batch, 0, 0)["pixel_values"]
    assert np.array_equal(e0, task.collate(batch, 0, 0)["pixel_values"])  # reproducible
    assert not np.array_equal(e0, plain)
    assert not np.array_equal(e0, task.collate(batch, 1, 0)["pixel_values"])  # a new epoch
    # a row's draw is its own: the same file in another batch order gets the same crop
    flipped = {k: v[::-1].copy() for k, v in batch.items()}
    assert np.array_equal(task.collate(flipped, 0, 0)["pixel_values"], e0[::-1])
    # ... and it is drawn for that file: a copy of the image under another name gets another
    copy = tmp_path / "copy.png"
    shutil.copy(paths[0].decode(), copy)
    twins = {"_image": np.array([paths[0], str(copy).encode()], dtype="S"),
             "labels": np.zeros(2, np.int64)}  # fmt: skip
    a, b = task.collate(twins, 0, 0)["pixel_values"]
    assert not np.array_equal(a, b)


def test_random_resized_crop_draws_boxes_of_crop_ratio(tmp_path: Path, monkeypatch) -> None:
    """task.crop_ratio [2, 2.5]: every train crop is about twice as wide as it is high (the
    default [3/4, 4/3] never is); the crops are what the processor is given."""
    write_image_folder(tmp_path / "imgs", per_class=4, size=(40, 40))
    paths = sorted(str(p).encode() for p in (tmp_path / "imgs").rglob("*.png"))
    batch = {"_image": np.array(paths, dtype="S"), "labels": np.zeros(len(paths), np.int64)}
    options = {"random_resized_crop": True, "crop_scale": [0.2, 0.4], "crop_ratio": [2.0, 2.5]}
    task = tasks.get("image-classification", options)
    task.bind(object())
    seen: list[tuple[int, int]] = []
    monkeypatch.setattr(images, "pixel_values", lambda imgs, _: seen.extend(i.size for i in imgs))
    for epoch in range(3):
        task.collate(batch, epoch, 0)
    assert len(seen) == 3 * len(paths)
    assert all(1.8 <= w / h <= 2.8 for w, h in seen), seen


def test_jsonl_paths_resolve_against_the_jsonl_folder(tmp_path: Path) -> None:
    from ortft.data.rows import read_rows
    from ortft.data.spec import DataSection

    write_image_folder(tmp_path / "data" / "imgs", per_class=1)
    lines = ['{"image": "imgs/cat/000.png", "label": "cat"}', '{"image": "/abs.png", "label": "x"}']
    (tmp_path / "data" / "rows.jsonl").write_text("\n".join(lines) + "\n")
    spec = DataSection(train="data/rows.jsonl")
    rows = list(read_rows(spec, tmp_path, spec.train, "train", tasks.get("image-classification")))
    assert [r["image"] for r in rows] == [str(tmp_path / "data/imgs/cat/000.png"), "/abs.png"]


# --------------------------------------------------------------------------- runs


def _recipe(tmp_path: Path, data: str, backend: str = "torch", **training: object) -> Path:
    r = tiny_image_classifier(data, backend=backend, **training)
    r["export"] = {"enabled": False}
    return write_recipe(tmp_path / "r.yaml", r)


def _error_line(result) -> str:
    lines = [ln for ln in result.stderr.splitlines() if ln.startswith("error:")]
    assert result.returncode == 2, result.stderr[-2000:]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    return lines[0]


@pytest.mark.parametrize("bad", ["truncated", "not-an-image"])
def test_a_bad_file_in_a_class_folder_stops_the_run_naming_it(tmp_path: Path, bad: str) -> None:
    write_image_folder(tmp_path / "imgs")
    if bad == "truncated":
        path = _truncated_png(tmp_path / "imgs" / "dog" / "cut.png")
    else:
        path = tmp_path / "imgs" / "cat" / "readme.md"
        path.write_text("# notes")
    result = run_cli("train", _recipe(tmp_path, "imgs"), "--output-dir", tmp_path / "run")
    line = _error_line(result)
    assert str(path) in line and "data.on_bad_file=skip" in line


def test_a_missing_path_in_a_csv_stops_the_run_naming_it_and_its_row(tmp_path: Path) -> None:
    write_image_folder(tmp_path / "imgs")
    files = sorted((tmp_path / "imgs").rglob("*.png"))
    rows = [f"{p.relative_to(tmp_path)},{p.parent.name}" for p in files]
    rows.insert(5, "imgs/cat/gone.png,cat")
    (tmp_path / "train.csv").write_text("image,label\n" + "\n".join(rows) + "\n")
    r = tiny_image_classifier("train.csv", backend="torch")
    r["data"].update(eval_fraction=0.0)
    r["export"] = {"enabled": False}
    result = run_cli("train", write_recipe(tmp_path / "r.yaml", r), "--output-dir", tmp_path / "x")
    line = _error_line(result)
    assert f"row 6: {tmp_path / 'imgs/cat/gone.png'}: file not found" in line


def test_skip_leaves_bad_files_out_and_counts_them_and_the_conversions(tmp_path: Path) -> None:
    write_image_folder(tmp_path / "imgs")
    cat = tmp_path / "imgs" / "cat"
    Image.open(cat / "000.png").convert("L").save(cat / "gray.png")
    Image.open(cat / "001.png").convert("P").save(cat / "palette.png")
    Image.open(cat / "002.png").convert("RGBA").save(cat / "alpha.png")
    Image.fromarray(np.full((10, 12), 40000, np.uint16)).save(cat / "deep.png")
    _truncated_png(cat / "cut.png")
    (cat / "notes.txt").write_text("x")
    (cat / "003.png").unlink()
    (cat / "003.png").write_bytes(b"\x89PNG\r\n\x1a\n garbage")  # a PNG in name only
    recipe = _recipe(tmp_path, "imgs", max_steps=2)
    result = run_cli("train", recipe, "--output-dir", tmp_path / "run", "data.on_bad_file=skip",
                     "data.eval_fraction=0")  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    seen = summary(tmp_path / "run")["data"]["images"]["train"]
    assert seen["rows"] == 3 * 8 + 4 + 2 and seen["skipped"] == 3
    assert seen["used"] == seen["rows"] - 3
    assert seen["converted"] == {"I;16": 1, "L": 1, "P": 1, "RGBA": 1}
    for name in ("cut.png", "notes.txt", "003.png"):
        assert f"skipped {cat / name}" in result.stderr


def test_an_augmented_run_resumes_exactly(tmp_path: Path) -> None:
    write_image_folder(tmp_path / "imgs", size=(16, 16))
    r = tiny_image_classifier("imgs", backend="torch", max_steps=6)
    r["task"] = {"name": "image-classification", "random_resized_crop": True,
                 "crop_scale": [0.3, 1.0], "horizontal_flip": True}  # fmt: skip
    r["checkpoint"] = {"save_every": 3}
    r["export"] = {"enabled": False}
    recipe, run = write_recipe(tmp_path / "r.yaml", r), tmp_path / "run"
    assert run_cli("train", recipe, "--output-dir", run).returncode == 0
    full = losses(run)
    for name in ("final", "step-000006", "summary.json"):  # as if killed after step 3
        target = run / name
        shutil.rmtree(target) if target.is_dir() else target.unlink()
    again = run_cli("train", recipe, "--output-dir", run)
    assert again.returncode == 0, again.stderr[-2000:]
    assert summary(run)["resumed_from"].endswith("step-000003")
    assert losses(run) == full  # the same crops and flips after the resume: bit for bit


@pytest.mark.ort
def test_ort_trains_a_vit_like_pytorch_with_the_patch_embedding_in_ort(tmp_path: Path) -> None:
    write_image_folder(tmp_path / "imgs")
    recipe = _recipe(tmp_path, "imgs", backend="ort", max_steps=4)
    ort = run_cli("train", recipe, "--output-dir", tmp_path / "ort", "backend.save_onnx=true")
    assert ort.returncode == 0, ort.stderr[-2000:]
    ref = run_cli("train", recipe, "--output-dir", tmp_path / "torch", "backend.name=torch")
    assert ref.returncode == 0, ref.stderr[-2000:]
    backend = summary(tmp_path / "ort")["backend"]
    assert backend["used"] == "ort" and not backend["fallback"] and backend["ort_exports"] >= 1
    assert np.allclose(losses(tmp_path / "ort"), losses(tmp_path / "torch"), rtol=0, atol=1e-5)
    graphs = sorted((tmp_path / "ort" / "ort_graphs").glob("*.onnx"))
    assert graphs, "ORTModule saved no graph"
    ops = {
        n.op_type for g in graphs for n in onnx.load(str(g), load_external_data=False).graph.node
    }
    assert {"Conv", "Softmax", "MatMul"} <= ops  # patch embedding and attention ran in ORT


def test_the_shipped_digits_are_what_the_script_writes() -> None:
    """recipes/data/digits/ regenerates byte for byte from scikit-learn's digits.csv.gz."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    res = subprocess.run([sys.executable, str(root / "scripts" / "make-digits.py"), "--check"],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert res.returncode == 0, res.stderr
