"""``ortft predict`` for image classification: the label of each image file, with its scores.

Input (``--input``, read by ``ortft.inference.input_files``): a text file of image paths, one
per line, relative to the file's folder (``-``: stdin, relative to the working directory; blank
lines skipped); a folder: every image file under it (by extension, ``EXTENSIONS``; hidden files
and folders left out), recursively, sorted by path; or one image file. Every file is decoded whole once before anything is printed,
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

from collections.abc import Iterator
from typing import Any

import numpy as np

from ortft.core.errors import InputError
from ortft.core.reports import Prediction
from ortft.data import images
from ortft.inference.evaluate import SavedModel
from ortft.inference.input_files import Item, read

TOP_K = 5
PREPROCESS = "preprocess.onnx"
# what a folder's "image file" is: the formats Pillow reads that photos and datasets come in
EXTENSIONS = frozenset(
    (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm", ".pbm")
)


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


def logits(model: Any, runtime: str, pixel_values: np.ndarray) -> np.ndarray:
    """The logits of a float32 [batch, 3, H, W] ``pixel_values``: ``model`` is the PyTorch
    model or, on ``runtime`` onnxruntime, the export's model.onnx session."""
    pixel_values = np.ascontiguousarray(pixel_values, dtype=np.float32)
    if runtime == "onnxruntime":
        return model.run(["logits"], {"pixel_values": pixel_values})[0]
    import torch

    with torch.no_grad():
        out = model(pixel_values=torch.from_numpy(pixel_values), return_dict=True)
    return out.logits.float().numpy()


def classify(m: SavedModel, items: list[Item], batch_size: int) -> Iterator[Prediction]:
    labels = m.labels() or []
    preprocess = preprocess_session(m)
    for start in range(0, len(items), batch_size):
        chunk = items[start : start + batch_size]
        scores = logits(m._model, m.runtime, pixel_values(m, chunk, preprocess))
        for i, (item, p) in enumerate(zip(chunk, _softmax(scores.astype(np.float64)), strict=True)):
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


def run(m: SavedModel, input_path: str, batch_size: int) -> Iterator[Prediction]:
    """One result per image ``--input`` names; every file checked first."""
    items = read(input_path, EXTENSIONS, "image")
    check(items)
    return classify(m, items, batch_size)
