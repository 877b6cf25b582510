"""``ortft predict`` for image classification: the label of each image file, with its scores.

Input (``--input``): a text file of image paths, one per line, relative to the file's folder
(``-``: stdin, relative to the working directory; blank lines skipped); a folder: every image
file under it (by extension, ``EXTENSIONS``; hidden files and folders left out), recursively,
sorted by path; or one image file. Every file is decoded whole once before anything is printed,
as training checks its rows (``ortft.data.images.check``), so a missing, non-image or truncated
file stops the command with one line, ``paths.txt:3: imgs/x.png: file not found`` (a folder's
file: its path alone), exit 2, and no predictions.

Output, one object per image in input order: ``index``; ``input`` (the path as its line gives
it, or FOLDER/<path under it>); ``label`` and ``score`` (the most probable label and its softmax
probability); ``scores`` (every label's); ``top_k`` (the 5 most probable ``[label, p]``, best
first, fewer with fewer labels).

PyTorch (a run dir or ``final/``): each file decoded to 8-bit RGB (``images.load``), the image
processor (PIL backend, as training's eval) gives ``pixel_values``, the model the logits. An
ONNX export: ``preprocess.onnx`` on each image's uint8 [height, width, 3] pixels (one image a
call: images differ in size), then ``model.onnx`` on the batch: what a client deploys, so a
client that runs the two graphs gets these numbers. An export without ``preprocess.onnx`` gets
the processor's ``pixel_values``, as PyTorch does.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from ortft.core.errors import InputError
from ortft.data import images
from ortft.inference.evaluate import SavedModel

TOP_K = 5
PREPROCESS = "preprocess.onnx"
# what a folder's "image file" is: the formats Pillow reads that photos and datasets come in
EXTENSIONS = frozenset(
    (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm", ".pbm")
)


@dataclass(frozen=True)
class Item:
    """One image to predict: where it was named (for errors), what ``input`` shows, the file."""

    where: str  # "paths.txt:3: imgs/x.png", or a folder's file path
    shown: str
    path: Path


def read_list(stream: TextIO, name: str, base: Path, kind: str = "image") -> list[Item]:
    """One item per non-blank line of ``stream`` (named ``name``), paths relative to ``base``
    (``kind``: what the files are, for the message)."""
    items = []
    not_text = InputError(
        f"{name}: not a text file of {kind} paths (give one path per line, or a folder)"
    )
    try:
        for n, line in enumerate(stream, 1):
            shown = line.strip()
            if "\x00" in shown or _undecoded(shown):  # e.g. an image piped into stdin
                raise not_text
            if shown:
                path = (base / shown).expanduser()
                items.append(Item(f"{name}:{n}: {shown}", shown, path))
    except UnicodeDecodeError:  # a file opened as UTF-8
        raise not_text from None
    return items


def _undecoded(text: str) -> bool:
    """Whether ``text`` holds bytes that were not UTF-8 (stdin decodes them to surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def read_folder(folder: Path, extensions: frozenset[str] = EXTENSIONS, kind: str = "image"):
    """Every ``kind`` file (by extension) under ``folder``, sorted by its path under it."""
    found = sorted(
        p.relative_to(folder)
        for p in folder.rglob("*")
        if p.suffix.lower() in extensions and p.is_file()
    )
    rels = [r for r in found if not any(part.startswith(".") for part in r.parts)]
    if not rels:
        raise InputError(f"{folder}: no {kind} files ({', '.join(sorted(extensions))}) in it")
    return [Item(str(folder / r), str(folder / r), folder / r) for r in rels]


def read(
    input_path: str, extensions: frozenset[str] = EXTENSIONS, kind: str = "image"
) -> list[Item]:
    """The files ``--input`` names: a list file, stdin (``-``), a folder or one file (an
    image; a family's predict passes its own, e.g. audio)."""
    if input_path == "-":
        return read_list(sys.stdin, "<stdin>", Path.cwd(), kind)
    path = Path(input_path)
    if path.is_dir():
        return read_folder(path, extensions, kind)
    if not path.is_file():
        raise InputError(f"{path}: input file or folder not found")
    if path.suffix.lower() in extensions:  # one file named directly
        return [Item(str(path), str(path), path)]
    with open(path, encoding="utf-8") as fh:
        return read_list(fh, str(path), path.parent, kind)


def check(items: list[Item]) -> None:
    """Every file decodes, before the first prediction is printed."""
    for item in items:
        try:
            images.check(str(item.path))
        except images.BadImage as err:
            raise InputError(f"{item.where}: {err}") from None


def _load(item: Item) -> Any:
    try:
        return images.load(str(item.path))
    except images.BadImage as err:  # it decoded in check(): the file changed since
        raise InputError(f"{item.where}: {err} (the file changed while predicting)") from None


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def preprocess_session(m: SavedModel) -> Any:
    """An ONNX export's ``preprocess.onnx`` session; None: the processor makes pixel_values."""
    graph = m.path / PREPROCESS
    if m.runtime != "onnxruntime" or not graph.exists():
        return None
    import onnxruntime as ort

    return ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])


def pixel_values(m: SavedModel, chunk: list[Item], preprocess: Any) -> np.ndarray:
    """float32 [len(chunk), 3, H, W]: from ``preprocess.onnx`` one image a call, else from the
    image processor (``m.tokenizer``) on the decoded batch."""
    decoded = [_load(item) for item in chunk]
    if preprocess is None:
        return images.pixel_values(decoded, m.tokenizer)
    rows = [
        preprocess.run(["pixel_values"], {"image": np.asarray(img, dtype=np.uint8)})[0]
        for img in decoded  # images.pixels(path): the same uint8 [height, width, 3]
    ]
    return np.concatenate(rows).astype(np.float32, copy=False)


def classify(m: SavedModel, items: list[Item], batch_size: int) -> Iterator[dict[str, Any]]:
    labels = m.labels() or []
    preprocess = preprocess_session(m)
    for start in range(0, len(items), batch_size):
        chunk = items[start : start + batch_size]
        logits = m.image_logits(pixel_values(m, chunk, preprocess))
        for i, (item, p) in enumerate(zip(chunk, _softmax(logits.astype(np.float64)), strict=True)):
            order = np.argsort(-p, kind="stable")[:TOP_K]
            best = int(order[0])
            yield {
                "index": start + i,
                "input": item.shown,
                "label": labels[best],
                "score": float(p[best]),
                "scores": {name: float(v) for name, v in zip(labels, p, strict=True)},
                "top_k": [[labels[int(j)], float(p[j])] for j in order],
            }


def run(m: SavedModel, input_path: str, batch_size: int) -> Iterator[dict[str, Any]]:
    """One result per image ``--input`` names; every file checked first."""
    items = read(input_path)
    check(items)
    return classify(m, items, batch_size)
