"""Image files: checked once when a split is encoded, decoded per batch.

Decoded pixels are never stored: a 3x224x224 float32 example is 600 kB, so 100k images would
be 60 GB. The encoded split keeps each image's path (and label); ``decode`` reads a batch's
files when the batch is trained on. ``check`` decodes every file once (``Image.load``, which
is what finds a truncated file: ``Image.open`` reads only the header) and says what was wrong.

Every image becomes 8-bit RGB, as transformers' image processors convert (``convert_rgb``):
an alpha channel is composited onto white, a palette is expanded, 16-bit samples are scaled to
8 bits (``>> 8``: 65535 -> 255), grayscale is repeated into three channels. The original mode
is recorded so a run counts what it converted.
"""

from __future__ import annotations

import zlib
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ortft.core.errors import first_line

WIDE = ("I;16", "I;16B", "I;16L", "I;16N", "I")  # 16/32-bit integer samples
ALPHA = ("RGBA", "LA", "PA", "RGBa", "La")
MODE = "_mode"  # an encoded split's column: each image's mode as read (RGB, L, P, RGBA, I;16...)


class BadImage(Exception):
    """A file that is not a usable image (the reason is the message)."""


def _pil() -> Any:
    from PIL import Image

    return Image


def check(path: str) -> str:
    """The image's mode (RGB, L, P, RGBA, I;16...), after decoding it whole; ``BadImage``
    naming what is wrong otherwise."""
    Image = _pil()
    if not Path(path).is_file():
        raise BadImage("file not found")
    try:
        with Image.open(path) as img:
            mode = img.mode
            img.load()  # decodes every pixel: a truncated file fails here, not mid-run
    except Image.DecompressionBombError as err:
        raise BadImage(f"too large to decode ({err})") from None
    # Pillow's "cannot identify image file" is an OSError, a truncated file's too; a damaged
    # header can raise SyntaxError, ValueError or struct.error: any failure is a bad file
    except Exception as err:  # noqa: BLE001
        first = first_line(err)
        if "cannot identify image file" in first:
            first = "not an image Pillow can read"
        raise BadImage(first) from None
    return mode


def to_rgb(img: Any) -> Any:
    """``img`` as an 8-bit RGB Pillow image (see the module docstring for each mode)."""
    Image = _pil()
    if img.mode == "RGB":
        return img
    if img.mode in WIDE:
        arr = np.asarray(img).astype(np.uint32)
        img = Image.fromarray((np.clip(arr, 0, 65535) >> 8).astype(np.uint8), mode="L")
    elif img.mode == "F":
        img = Image.fromarray(np.clip(np.asarray(img), 0, 255).astype(np.uint8), mode="L")
    if img.mode == "P" and "transparency" in img.info:
        img = img.convert("RGBA")
    if img.mode in ALPHA:
        rgba = img.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return img.convert("RGB")


def load(path: str) -> Any:
    """The decoded RGB image of ``path`` (a Pillow image); ``BadImage`` if it cannot be read
    (a file changed since its split was checked)."""
    Image = _pil()
    try:
        with Image.open(path) as img:
            img.load()
            return to_rgb(img)
    except Exception as err:  # noqa: BLE001 - as in check()
        raise BadImage(first_line(err)) from None


def pixels(path: str) -> np.ndarray:
    """The decoded image as uint8 [height, width, 3]: what ``preprocess.onnx`` takes."""
    return np.asarray(load(path), dtype=np.uint8)


def seed_of(path: bytes | str) -> int:
    """A row's augmentation stream is seeded by its path (crc32), the run's seed and the
    epoch: the same image gets the same crop in the same epoch, however batches fall, so a
    resumed run draws what the uninterrupted one drew."""
    return zlib.crc32(path if isinstance(path, bytes) else path.encode())


def random_resized_crop(
    img: Any, rng: np.random.Generator, scale: Sequence[float], ratio: Sequence[float]
) -> Any:
    """torchvision's RandomResizedCrop box (10 tries at an area share in ``scale`` and an
    aspect ratio in ``ratio``, else the centre crop), cut out of ``img``; the processor then
    resizes it as it resizes every image."""
    width, height = img.size
    area = width * height
    log_ratio = np.log(ratio[0]), np.log(ratio[1])
    for _ in range(10):
        target = area * rng.uniform(scale[0], scale[1])
        aspect = float(np.exp(rng.uniform(*log_ratio)))
        w = int(round(np.sqrt(target * aspect)))
        h = int(round(np.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = int(rng.integers(0, height - h + 1))
            left = int(rng.integers(0, width - w + 1))
            return img.crop((left, top, left + w, top + h))
    side = min(width, height)  # the fallback: the largest centred square
    left, top = (width - side) // 2, (height - side) // 2
    return img.crop((left, top, left + side, top + side))


def resize_shorter(img: Any, size: int) -> Any:
    """``img`` resized (bilinear) so that its shorter side is ``size``, the longer in proportion
    (torchvision's ``Resize(size)``: the longer side is truncated, ``int(size * long / short)``)."""
    width, height = img.size
    short, long = min(width, height), max(width, height)
    other = int(size * long / short)
    new = (size, other) if width <= height else (other, size)
    return img if new == img.size else img.resize(new, _pil().Resampling.BILINEAR)


def hflip(img: Any) -> Any:
    """``img`` mirrored left to right."""
    return img.transpose(_pil().Transpose.FLIP_LEFT_RIGHT)


def pixel_values(images: list[Any], processor: Any) -> np.ndarray:
    """The processor's pixel_values (float32 [batch, 3, H, W]) of RGB Pillow images."""
    out = processor(images=images, return_tensors="np")["pixel_values"]
    return np.ascontiguousarray(out, dtype=np.float32)


def split_report(splits: dict[str, tuple[Any, Any]]) -> dict[str, Any]:
    """summary.json's data.images: per split, the rows read, the images used, the files
    skipped (data.on_bad_file=skip) and the images converted to RGB, by original mode (the
    encoded split's ``MODE`` column)."""
    report = {}
    for split, (rows, encoded) in splits.items():
        if rows is None or encoded is None:
            continue
        modes = Counter(m.decode() for m in encoded.column(MODE))
        report[split] = {
            "rows": len(rows),
            "used": len(encoded),
            "skipped": len(rows) - len(encoded),
            "converted": {m: n for m, n in sorted(modes.items()) if m != "RGB"},
        }
    return {"images": report}
