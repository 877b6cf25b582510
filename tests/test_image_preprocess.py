"""preprocess.onnx (ortft.families.vision.preprocess) against transformers' PIL-backend
processors: every value equal, for each filter, fixed and shortest-edge sizes, crops, up and
down.

The sweep behind ``TOL_LSB`` (random and smooth images, random sizes, each filter):
``.venv/bin/python tests/test_image_preprocess.py [N]`` prints, per case, the worst difference
in pixel steps and the fraction of values that differ at all.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from transformers import (
    BeitImageProcessorPil,
    BitImageProcessorPil,
    ConvNextImageProcessorPil,
    DeiTImageProcessorPil,
    ViTImageProcessorPil,
)
from transformers.image_utils import PILImageResampling as R

from ortft.core.errors import InputError
from ortft.families.vision import preprocess as ip

ROOT = Path(__file__).resolve().parent.parent


def _random(h: int, w: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def _smooth(h: int, w: int) -> np.ndarray:
    yy, xx = np.mgrid[0:h, 0:w]
    chans = [127 + 120 * np.sin(xx / 7 + c) * np.cos(yy / 11) for c in range(3)]
    return np.stack(chans, -1).round().astype(np.uint8)


def _gray(h: int, w: int) -> np.ndarray:  # a grayscale picture converted to RGB by the client
    return np.repeat(_random(h, w, seed=3)[..., :1], 3, axis=-1)


def _built(tmp_path: Path, processor) -> Path:
    path = tmp_path / "preprocess.onnx"
    desc = ip.build(processor, path)
    json.dumps(desc)  # goes into export.json as is
    return path


def _assert_matches(tmp_path: Path, processor, images: list[np.ndarray]) -> dict:
    report = ip.check(_built(tmp_path, processor), processor, images)
    assert report["passed"], report
    assert report["values_off"] == 0, report  # PIL's own arithmetic: exact (TOL_LSB's comment)
    return report


@pytest.mark.parametrize("resample", [R.BILINEAR, R.BICUBIC, R.NEAREST])
def test_upscale_digits(tmp_path: Path, resample) -> None:
    """The shipped recipe: scikit-learn's 8x8 digits to a 32x32 ViT."""
    proc = ViTImageProcessorPil(size={"height": 32, "width": 32}, resample=resample)
    report = _assert_matches(tmp_path, proc, [_random(8, 8), _smooth(8, 8), _gray(8, 8)])
    assert report["images"] == 3


@pytest.mark.parametrize("resample", [R.BILINEAR, R.BICUBIC])
def test_downscale_and_odd_aspect(tmp_path: Path, resample) -> None:
    proc = ViTImageProcessorPil(size={"height": 48, "width": 40}, resample=resample)
    images = [_random(200, 300), _smooth(200, 300), _random(211, 37), _gray(61, 95)]
    # height shrinks more than twice what width does: the Pillow 13 pass order that differs
    images.append(_random(171, 45))
    images += [_random(48, 40), _random(48, 25), _random(30, 40)]  # passes PIL skips
    _assert_matches(tmp_path, proc, images)


def test_near_ties_round_as_pil_does(tmp_path: Path) -> None:
    """13x9 -> 8x8 bilinear: float32 resampling (ONNX Resize) put 7.8% of these values one step
    off, enough to flip a barely trained model's label; PIL's integer weights put none."""
    proc = ViTImageProcessorPil(size={"height": 8, "width": 8})
    _assert_matches(tmp_path, proc, [_random(13, 9, seed=s) for s in range(4)])


def test_pass_order_is_known() -> None:
    assert ip._pass_order() != "unknown"  # a new Pillow rule: supported_problem says so


def test_shortest_edge_and_crop(tmp_path: Path) -> None:
    """Bit/CLIP style: shortest edge to 24 (aspect kept), then a 20x20 centre crop."""
    proc = BitImageProcessorPil(size={"shortest_edge": 24}, crop_size={"height": 20, "width": 20})
    _assert_matches(tmp_path, proc, [_random(50, 30), _random(30, 77), _smooth(40, 40)])


def test_convnext_crop_pct(tmp_path: Path) -> None:
    proc = ConvNextImageProcessorPil(size={"shortest_edge": 28}, crop_pct=0.875)
    _assert_matches(tmp_path, proc, [_random(45, 70), _smooth(90, 33)])


def test_crop_larger_than_image_pads(tmp_path: Path) -> None:
    """DeiT: resize to 20x16, crop 24x18: transformers pads with zeros (ceil half on top)."""
    proc = DeiTImageProcessorPil(
        size={"height": 20, "width": 16}, crop_size={"height": 24, "width": 18}
    )
    _assert_matches(tmp_path, proc, [_random(33, 21)])


def test_no_resize_beit_and_rescale_only(tmp_path: Path) -> None:
    proc = BeitImageProcessorPil(do_resize=False)
    _assert_matches(tmp_path, proc, [_random(9, 13)])
    proc = ViTImageProcessorPil(size={"height": 16, "width": 16}, do_normalize=False)
    _assert_matches(tmp_path, proc, [_random(10, 30)])


def test_description(tmp_path: Path) -> None:
    desc = ip.build(ViTImageProcessorPil(size={"height": 32, "width": 32}), tmp_path / "p.onnx")
    assert desc["output"] == "pixel_values: float32 [1, 3, 32, 32]"
    assert desc["resize"]["size"] == {"height": 32, "width": 32}
    assert desc["resize"]["interpolation"] == "bilinear, antialiased (PIL's filter)"
    assert desc["rescale"] == pytest.approx(1 / 255) and desc["std"] == [0.5, 0.5, 0.5]
    assert desc["ir_version"] == 8


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"resample": R.LANCZOS}, "LANCZOS"),
        ({"size": {"shortest_edge": 20, "longest_edge": 40}}, "size="),
        ({"do_pad": True}, "do_pad"),
    ],
)
def test_unsupported_is_input_error(tmp_path: Path, kwargs, named) -> None:
    proc = ViTImageProcessorPil(**kwargs)
    problem = ip.supported_problem(proc)
    assert problem and named in problem and "\n" not in problem
    with pytest.raises(InputError, match=named):
        ip.build(proc, tmp_path / "p.onnx")


def test_processor_that_overrides_the_pipeline_is_refused(tmp_path: Path) -> None:
    from transformers import LevitImageProcessorPil  # its own resize (a crop_pct of its own)

    problem = ip.supported_problem(LevitImageProcessorPil())
    assert problem and "LevitImageProcessorPil overrides resize" in problem
    with pytest.raises(InputError, match="opset 17"):
        ip.build(ViTImageProcessorPil(), tmp_path / "p.onnx", opset=17)


def test_torchvision_backend_is_refused() -> None:
    """The torchvision backend resizes in float (no uint8 rounding): not what the graph does."""
    from types import SimpleNamespace

    problem = ip.supported_problem(SimpleNamespace(backend="torchvision"))
    assert problem and "backend='pil'" in problem


@pytest.mark.consumer
def test_runs_in_recent_onnxruntime(tmp_path: Path) -> None:
    """The graph in the clean consumer venv (onnxruntime 1.32, numpy, no ortft, no Pillow)."""
    py = subprocess.run(
        [str(ROOT / "scripts" / "consumer-env.sh")], capture_output=True, text=True, check=True
    ).stdout.strip()
    proc = BitImageProcessorPil(size={"shortest_edge": 24}, crop_size={"height": 20, "width": 20})
    path = _built(tmp_path, proc)
    from PIL import Image

    image = _random(50, 31)
    np.save(tmp_path / "image.npy", image)
    ref = proc(images=[Image.fromarray(image)], return_tensors="np")["pixel_values"]
    code = (
        "import sys, numpy as np, onnxruntime as ort\n"
        "s = ort.InferenceSession(sys.argv[1], providers=['CPUExecutionProvider'])\n"
        "np.save(sys.argv[3], s.run(None, {'image': np.load(sys.argv[2])})[0])\n"
    )
    out = tmp_path / "out.npy"
    subprocess.run([py, "-c", code, str(path), str(tmp_path / "image.npy"), str(out)], check=True)
    assert np.array_equal(np.load(out), ref)  # measured: the same bits as ORT 1.19 and PIL


# --------------------------------------------------------------------------- the TOL_LSB sweep


def _line(label: str, proc, path: Path, images: list[np.ndarray]) -> str:
    step = proc.rescale_factor / min(proc.image_std)  # one pixel step in pixel_values
    r = ip.check(path, proc, images)
    return (
        f"{label:40s} worst {r['max_abs_diff'] / step:.2f} steps ({r['max_abs_diff']:.5f}), "
        f"{100 * r['values_off']:.3f}% values off, mean {r['mean_abs_diff']:.2e}"
    )


def sweep(n: int, tmp: Path) -> None:
    """n random sizes 1..260 per filter, target and image kind; then the named cases."""
    rng = np.random.default_rng(1)
    targets = {"32x32": {"height": 32, "width": 32}, "224x224": {"height": 224, "width": 224},
               "shortest_edge 40": {"shortest_edge": 40}}  # fmt: skip
    for name in ("BILINEAR", "BICUBIC", "NEAREST"):
        for target, size in targets.items():
            proc = ViTImageProcessorPil(size=size, resample=R[name])
            ip.build(proc, tmp / "p.onnx")
            for kind, make in (("random", _random), ("smooth", _smooth)):
                sizes = [(int(a), int(b)) for a, b in rng.integers(1, 261, (n, 2))]
                images = [make(h, w) for h, w in sizes]
                print(_line(f"{name} -> {target}, {n} {kind}", proc, tmp / "p.onnx", images))
    for label, (h, w), size in (
        ("8x8 -> 32x32", (8, 8), {"height": 32, "width": 32}),
        ("300x200 -> 224x224", (200, 300), {"height": 224, "width": 224}),
    ):
        for name in ("BILINEAR", "BICUBIC"):
            proc = ViTImageProcessorPil(size=size, resample=R[name])
            ip.build(proc, tmp / "p.onnx")
            for kind, images in (("random", [_random(h, w, s) for s in range(20)]),
                                 ("smooth", [_smooth(h, w)])):  # fmt: skip
                print(_line(f"{name} {label}, {kind}", proc, tmp / "p.onnx", images))


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        sweep(int(sys.argv[1]) if len(sys.argv) > 1 else 100, Path(tmp))
