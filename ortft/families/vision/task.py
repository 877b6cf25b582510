"""image-classification: one label per image (ViT, DeiT, BEiT, Swin, ConvNeXt, ResNet...);
accuracy, macro-F1, and top-5 accuracy where there are more than 5 classes.

Rows name image files (``data.image_column``, or a folder of class sub-folders). ``encode``
checks every file once and keeps its path, label and original mode (``ortft.data.images``);
``collate`` decodes a batch's files, applies the train-time augmentation (train batches only)
and runs the model's image processor (its PIL backend: the same code ``ortft predict`` runs,
and what the exported ``preprocess.onnx`` reproduces) into ``pixel_values``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field, model_validator

from ortft.core.errors import InputError
from ortft.data import images
from ortft.families.vision.starter import STARTER
from ortft.tasks.base import Encoded, Task, TaskOptions, skip_bad_file
from ortft.tasks.metrics import macro_f1

PATH = "_image"  # the encoded column of file paths (bytes); "_": never fed to the model
MODE = images.MODE
TOP_K = 5
Share = Annotated[float, Field(gt=0.0, le=1.0)]
Ratio = Annotated[float, Field(gt=0.0)]


class Options(TaskOptions):
    name: Literal["image-classification"] = "image-classification"
    random_resized_crop: bool = Field(
        False,
        description="Train batches: crop each image to a random box (area share in crop_scale, "
        "aspect ratio in crop_ratio) before the processor resizes it, as torchvision's "
        "RandomResizedCrop. Seeded by training.seed, the epoch and the file: resume is exact.",
    )
    crop_scale: tuple[Share, Share] = Field(
        (0.08, 1.0), description="random_resized_crop: the box's share of the image's area."
    )
    crop_ratio: tuple[Ratio, Ratio] = Field(
        (3 / 4, 4 / 3), description="random_resized_crop: the box's aspect ratio range."
    )
    horizontal_flip: bool = Field(
        False, description="Train batches: mirror half the images left to right (seeded)."
    )

    @model_validator(mode="after")
    def _ordered(self) -> Options:
        for field in ("crop_scale", "crop_ratio"):
            low, high = getattr(self, field)
            if low > high:
                raise ValueError(f"task.{field}: [{low}, {high}] must be [low, high]")
        return self


class ImageClassification(Task):
    name = "image-classification"
    modality = "image"
    auto_class = "AutoModelForImageClassification"
    row_local = True  # each file checked on its own
    needs_logits = True
    needs_labels = True
    export_kind = "image"
    starter = STARTER  # ortft init --task
    aligned_keys = ()  # nothing has a sequence axis to cut
    predicts = "image-label"
    eval_metrics = ("eval_loss", "eval_accuracy", "eval_f1_macro", "eval_top5_accuracy")
    hf_architectures = ("ForImageClassification",)

    @property
    def main_input(self) -> str:
        return "pixel_values"

    def __init__(self, options: Options) -> None:
        self.options = options
        self.processor: Any = None  # bound once the run has loaded it (``bind``)

    def columns(self, data) -> list[str]:
        return [data.image_column, data.label_column]

    def file_column(self, data) -> str | None:
        return data.image_column

    def bind(self, processor: Any) -> None:
        self.processor = processor

    def encode(self, rows, tokenizer, data, label2id) -> Encoded:
        paths, labels, modes = [], [], []
        for i, row in enumerate(rows):
            path = row[data.image_column]
            if not isinstance(path, str):  # e.g. a datasets Image feature's {bytes, path}
                raise InputError(
                    f"row {i + 1}: data.image_column '{data.image_column}' holds a "
                    f"{type(path).__name__}, not an image file path"
                )
            try:
                mode = images.check(path)
            except images.BadImage as err:
                skip_bad_file(data, i + 1, path, err)
                continue
            key = str(row[data.label_column])
            if key not in label2id:
                raise InputError(
                    f"row {i + 1}: label '{key}' is not one of data.label_names {list(label2id)}"
                )
            paths.append(path.encode())
            labels.append(label2id[key])
            modes.append(mode.encode())
        return Encoded(
            {
                PATH: np.array(paths, dtype="S") if paths else np.zeros(0, dtype="S1"),
                "labels": np.array(labels, dtype=np.int64),
                MODE: np.array(modes, dtype="S") if modes else np.zeros(0, dtype="S1"),
            }
        )

    def collate(self, batch, epoch, seed) -> dict[str, np.ndarray]:
        """The batch's images decoded, augmented (``epoch`` given: a train batch) and run
        through the processor."""
        if self.processor is None:
            raise RuntimeError("image-classification: collate before bind(processor)")
        o, decoded = self.options, []
        for raw in batch[PATH]:
            path = raw.decode()
            try:
                img = images.load(path)
            except images.BadImage as err:
                raise InputError(f"{path}: {err} (the file changed since it was checked)") from None
            if epoch is not None and (o.random_resized_crop or o.horizontal_flip):
                rng = np.random.default_rng([seed, epoch, images.seed_of(raw)])
                if o.random_resized_crop:
                    img = images.random_resized_crop(img, rng, o.crop_scale, o.crop_ratio)
                if o.horizontal_flip and rng.random() < 0.5:
                    img = images.hflip(img)
            decoded.append(img)
        return {**batch, "pixel_values": images.pixel_values(decoded, self.processor)}

    def forward(  # type: ignore[override]  # a modality's forward takes its own inputs
        self, model, labels, pixel_values, **extra
    ) -> tuple[Any, Any]:
        out = model(pixel_values=pixel_values, labels=labels, return_dict=True)
        return out.loss, out.logits

    def metrics(self, loss, logits, labels) -> dict[str, Any]:
        gold = np.concatenate(labels) if labels else np.zeros(0, dtype=np.int64)
        out: dict[str, Any] = {"loss": loss, "accuracy": 0.0, "f1_macro": 0.0}
        if not len(gold):
            return out
        scores = np.concatenate(logits)
        pred = scores.argmax(-1)
        out["accuracy"] = float(np.mean(pred == gold))
        out["f1_macro"] = macro_f1(pred, gold)
        if scores.shape[-1] > TOP_K:  # top-5 of 5 classes or fewer is always 1
            top = np.argsort(-scores, axis=-1)[:, :TOP_K]
            out["top5_accuracy"] = float(np.mean((top == gold[:, None]).any(-1)))
        return out

    def data_report(self, splits: dict[str, tuple[Any, Any]]) -> dict[str, Any]:
        """summary.json's data.images (``images.split_report``)."""
        return images.split_report(splits)
