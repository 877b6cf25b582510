"""Write the real handwritten-digit images the image-classification recipes train on.

Source: scikit-learn's copy of the UCI "Optical Recognition of Handwritten Digits" test set
(sklearn/datasets/data/digits.csv.gz, 1797 rows of 64 pixel counts 0..16 then the label), read
directly with csv + gzip + numpy so that no scikit-learn code runs.

Output, under recipes/data/digits/:
    images/0000.png ... images/1796.png   8x8 grayscale ("L") PNGs, pixel = round(v * 255 / 16)
                                          (Python's round, half to even: v = 8 -> 127.5 -> 128)
    train.csv, eval.csv                   header `image,label`; image paths relative to the CSV
    README.md                             source, licence, this command, the split rule

Split (index-based, held out): row i goes to eval.csv when i % 5 == 4, else to train.csv
(359 eval, 1438 train; every digit is in both, eval holds 21..52 of each).

Re-running writes identical bytes (Pillow's PNG writer with fixed options, no metadata);
`--check` regenerates into a temporary folder and compares it byte for byte with the
committed one (exit 1 and one line on the first difference).
    python scripts/make-digits.py [--check]
"""

from __future__ import annotations

import csv
import gzip
import importlib.util
import io
import sys
from pathlib import Path

import numpy as np
from PIL import Image

OUT = Path(__file__).resolve().parent.parent / "recipes" / "data" / "digits"
N_ROWS = 1797
EVAL_EVERY, EVAL_AT = 5, 4
# one lookup table so the rounding rule is stated once (Python's round: half to even)
LEVELS = np.array([round(v * 255 / 16) for v in range(17)], dtype=np.uint8)

README = """\
# digits: real handwritten digits, 8x8 grayscale

1797 scanned handwritten digits (0-9) as 8x8 grayscale PNGs, with a held-out split:
`train.csv` (1438 rows) and `eval.csv` (359 rows), columns `image,label`.

**Source.** The test set of the UCI Machine Learning Repository's *Optical Recognition of
Handwritten Digits* data set (E. Alpaydin, C. Kaynak, Bogazici University, July 1998;
https://archive.ics.uci.edu/dataset/80/optical+recognition+of+handwritten+digits), as shipped
by scikit-learn in `sklearn/datasets/data/digits.csv.gz` (`sklearn.datasets.load_digits`).
NIST's preprocessing extracted 32x32 bitmaps from forms filled in by 43 people; each 4x4 block
was counted into one pixel (0..16), giving 8x8 images.

**Licence.** scikit-learn's description (`load_digits().DESCR`) gives the provenance above and
states no licence of its own; the UCI repository lists this data set under Creative Commons
Attribution 4.0 International (CC BY 4.0, https://creativecommons.org/licenses/by/4.0/).
Cite: Alpaydin, E. & Kaynak, C. (1998). Optical Recognition of Handwritten Digits. UCI Machine
Learning Repository. Changes made here: pixel counts scaled to 0..255 and written as PNG
files, rows split into train/eval.

**How these files were made.**

    python scripts/make-digits.py           # writes this folder
    python scripts/make-digits.py --check   # regenerates and compares byte for byte

Pixel = round(v * 255 / 16) (half to even). Split: row i (0-based, in the file's order) is in
`eval.csv` when i % 5 == 4, else in `train.csv`; image `images/{i:04d}.png` is row i.
"""


def source_path() -> Path:
    """digits.csv.gz inside whichever scikit-learn this interpreter has (no sklearn import)."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or spec.origin is None:
        sys.exit(
            "make-digits: scikit-learn is not installed in this Python (pip install scikit-learn)"
        )
    return Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz"


def read_rows(path: Path) -> tuple[np.ndarray, list[str]]:
    with gzip.open(path, "rt", newline="") as f:
        rows = [[int(float(x)) for x in r] for r in csv.reader(f) if r]
    data = np.array(rows, dtype=np.int64)
    if data.shape != (N_ROWS, 65) or data[:, :64].min() < 0 or data[:, :64].max() > 16:
        sys.exit(
            f"make-digits: {path}: expected {N_ROWS} rows of 64 pixels 0..16 + label, got {data.shape}"
        )
    return data[:, :64].reshape(-1, 8, 8), [str(v) for v in data[:, 64]]


def png_bytes(pixels: np.ndarray) -> bytes:
    buf = io.BytesIO()
    # fixed options and no metadata chunks: the same pixels always give the same bytes
    Image.fromarray(LEVELS[pixels]).save(buf, format="PNG", optimize=False, compress_level=9)
    return buf.getvalue()


def write_all(out: Path) -> None:
    images, labels = read_rows(source_path())
    (out / "images").mkdir(parents=True, exist_ok=True)
    splits: dict[str, list[tuple[str, str]]] = {"train": [], "eval": []}
    for i, (pixels, label) in enumerate(zip(images, labels, strict=True)):
        name = f"images/{i:04d}.png"
        (out / name).write_bytes(png_bytes(pixels))
        splits["eval" if i % EVAL_EVERY == EVAL_AT else "train"].append((name, label))
    for split, rows in splits.items():
        with open(out / f"{split}.csv", "w", newline="") as f:
            writer = csv.writer(f, lineterminator="\n")
            writer.writerow(["image", "label"])
            writer.writerows(rows)
    (out / "README.md").write_text(README)


if __name__ == "__main__":
    from regenerate import main  # scripts/regenerate.py

    main("make-digits", write_all, OUT, __doc__)
