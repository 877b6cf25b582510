"""An image classifier's export: ``model.onnx`` on pixel values, ``preprocess.onnx`` on the
decoded image, each checked against what the run trained and evaluated with.

- ``model.onnx``: ``pixel_values`` float32 [batch, 3, H, W] (dynamic batch) -> ``logits``
  [batch, num_labels]. Parity is the text rule (``ortft.export.parity``): PyTorch's logits on
  the held-out images, decoded and processed by the task's own ``collate`` (eval's path),
  max |diff| within the tolerance. ``--optimize``, ``--fp16`` and ``--quantize int8`` (Conv
  stays float: ``onnx_tools.quantize_int8``) work unchanged and are judged as for text.
- ``preprocess.onnx`` (``ortft.families.vision.preprocess``): ``image`` uint8 [height, width, 3]
  RGB -> ``pixel_values`` [1, 3, H, W], checked against the image processor on the same decoded
  images (export.json's ``preprocess``); a failed check fails the export as parity does. A
  processor the graph cannot express (a LANCZOS resize, padding...) gets ``model.onnx`` alone,
  and ``preprocess`` says why.
- ``end_to_end`` (recorded, not gated): preprocess.onnx then model.onnx, one image at a time as
  a client runs them, against PyTorch's logits. preprocess.onnx's check allows one pixel
  step per value, which could flip a near tie (measured: 0 steps, logits 1.2e-7 apart).
- ``preprocessor_config.json`` (the processor, to load with ``backend="pil"``), ``config.json``
  with ``id2label``, the model card (``ortft.export.deploy``): Pillow decodes, to RGB as
  ``ortft.data.images.to_rgb`` does (alpha over white), then the two graphs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ortft.core.reports import ExportReport
from ortft.data import images
from ortft.export import generation, parity
from ortft.families.vision import preprocess as image_preprocess
from ortft.families.vision.task import PATH

MODEL, PREPROCESS = "model.onnx", "preprocess.onnx"
CARD_IMAGE = "image.png"  # the card snippet's input file (a user puts theirs there)
INPUT = "pixel_values"
AXES = {INPUT: {0: "batch"}, "logits": {0: "batch"}}
# synthetic images (no held-out data to read): random sizes around the usual inputs, so the
# processor resizes up and down
SYNTHETIC_SIDES = (7, 97)


class _Logits(torch.nn.Module):
    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=pixel_values, return_dict=True).logits


def decoded(task: Any, processor: Any, samples: Any, n: int) -> tuple[dict, list[np.ndarray], str]:
    """(feeds, images, source): up to ``n`` held-out images through ``task.collate`` (feeds:
    pixel_values and labels) and each one decoded (uint8 [h, w, 3], what preprocess.onnx
    takes); else ``n`` random images through the processor ("synthetic")."""
    if samples is not None and len(samples):
        batch = samples.take(np.arange(min(n, len(samples))))
        task.bind(processor)
        feeds = {INPUT: task.collate(batch, None, 0)[INPUT], "labels": batch["labels"]}
        return feeds, [images.pixels(p.decode()) for p in batch[PATH]], "eval data"
    from PIL import Image

    rng = np.random.default_rng(0)
    pics = [
        rng.integers(0, 256, (*rng.integers(*SYNTHETIC_SIDES, size=2), 3), dtype=np.uint8)
        for _ in range(n)
    ]
    feeds = {INPUT: images.pixel_values([Image.fromarray(p) for p in pics], processor)}
    return feeds, pics, "synthetic"


class ImageGraph:
    """``build`` fills the staging folder: model.onnx (+ variants), preprocess.onnx, the
    processor and config, and returns export.json's sections (the caller adds the runtimes
    and the card: ``exporter.deployable``)."""

    def __init__(
        self,
        model: Any,
        processor: Any,
        task: Any,
        *,
        opset: int,
        tolerance: float,
        samples: Any,
        kinds: list[str],
        n: int,
    ):
        self.model, self.processor, self.task = model, processor, task
        self.opset, self.tolerance, self.kinds = opset, tolerance, kinds
        self.feeds, self.images, self.source = decoded(task, processor, samples, n)
        self.wrapper = _Logits(model).eval()

    @property
    def runtime_feeds(self) -> dict[str, np.ndarray]:
        """What ``--check-runtime`` runs each graph on (``deploy.graph_feeds``)."""
        return {INPUT: self.feeds[INPUT], "image": self.images[0]}

    def build(self, tmp: Path) -> ExportReport:
        pixel_values = self.feeds[INPUT]
        example = torch.from_numpy(pixel_values[:2])
        if len(example) < 2:  # a batch of 2 keeps the batch axis a variable in the graph
            example = torch.cat([example, example])
        export_s = _export(self.wrapper, example, tmp / MODEL, self.opset)
        with torch.no_grad():
            want = self.wrapper(torch.from_numpy(pixel_values)).numpy()
        ref = parity.Reference(self.feeds, want, "row", self.tolerance, self.source, (INPUT,))
        self.processor.save_pretrained(tmp)  # preprocessor_config.json
        generation.save(self.model, tmp)  # config.json
        result = parity.build_report(
            tmp,
            ref,
            task=self.task.name,
            model_type=getattr(self.model.config, "model_type", None),
            opset=self.opset,
            kinds=self.kinds,
            export_s=export_s,
        )
        result["preprocessor"] = preprocessor(self.processor)
        result["preprocess"] = preprocess(self.processor, tmp, PREPROCESS, self.images, self.source)
        if result["preprocess"].get("passed"):
            result["files"]["preprocess"] = PREPROCESS
            result["end_to_end"] = end_to_end(tmp, self.images, want, self.feeds.get("labels"))
        return result


def preprocess(
    processor: Any, folder: Path, file: str, pics: list[np.ndarray], source: str
) -> dict[str, Any]:
    """export.json's ``preprocess``: ``file`` (under ``folder``) built from the image processor
    and checked against it on ``pics`` (decoded uint8 [h, w, 3]), or why there is none
    (``exported: false``). The vision-language export writes its own with it too."""
    problem = image_preprocess.supported_problem(processor)
    if problem is not None:
        return {"exported": False, "reason": problem}
    described = image_preprocess.build(processor, folder / file)
    checked = image_preprocess.check(folder / file, processor, pics)
    return {"exported": True, "file": file, **described, "source": source, **checked}


def end_to_end(
    folder: Path, pics: list[np.ndarray], want: np.ndarray, labels: np.ndarray | None
) -> dict[str, Any]:
    """preprocess.onnx then model.onnx on each decoded image, against PyTorch's logits."""
    pre, model = parity.session(folder / PREPROCESS), parity.session(folder / MODEL)
    got = np.concatenate(
        [model.run(["logits"], {INPUT: pre.run(None, {"image": p})[0]})[0] for p in pics]
    )
    j = parity.judge(got, want, {} if labels is None else {"labels": labels}, "row")
    return {
        "images": len(pics),
        "max_abs_diff": j["max_abs_diff"],
        "prediction_agreement": j["prediction_agreement"],
        "accuracy": j["accuracy"],
        "accuracy_fp32": j["accuracy_fp32"],
        "accuracy_against": j["accuracy_against"],
        "gated": False,
    }


def _export(module: torch.nn.Module, example: torch.Tensor, path: Path, opset: int) -> float:
    """``onnx_tools.torch_export`` of the one-input graph; its seconds."""
    from ortft.export import onnx_tools as tools

    return tools.torch_export(module, (example,), path, opset, [INPUT], ["logits"], AXES)


# --------------------------------------------------------------------------- for clients


def preprocessor(processor: Any) -> dict[str, Any]:
    """export.json's ``preprocessor``: the image processor saved in the folder. transformers'
    ``AutoImageProcessor`` picks torchvision's backend when torchvision is installed, which
    resizes differently from the PIL one ortft trained with: load it with backend="pil"."""
    return {
        "file": "preprocessor_config.json",
        "class": type(processor).__name__,
        "backend": getattr(processor, "backend", None),
        "load": 'AutoImageProcessor.from_pretrained(folder, backend="pil")',
    }


# The card's snippet (``deploy.write_card``; tests/test_consumer.py runs it verbatim): Pillow
# decodes, ``to_rgb`` is ``ortft.data.images.to_rgb`` (what transformers' processors do too)
_HEAD = """import json
import numpy as np
import onnxruntime as ort
from PIL import Image

{sessions}
config = json.load(open("config.json"))


def to_rgb(img):  # as the image processor converts: 16-bit to 8, alpha over white
    if img.mode in ("I;16", "I;16B", "I;16L", "I;16N", "I"):
        img = Image.fromarray((np.clip(np.asarray(img), 0, 65535) >> 8).astype(np.uint8))
    elif img.mode == "F":
        img = Image.fromarray(np.clip(np.asarray(img), 0, 255).astype(np.uint8))
    if img.mode == "P" and "transparency" in img.info:
        img = img.convert("RGBA")
    if img.mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        white = Image.new("RGBA", img.size, (255, 255, 255, 255))
        img = Image.alpha_composite(white, img.convert("RGBA"))
    return img.convert("RGB")


image = to_rgb(Image.open({image}))
"""
_PIXELS = {
    True: """pixel_values = preprocess.run(None, {"image": np.asarray(image, dtype=np.uint8)})[0]
""",
    # no preprocess.onnx: the processor itself, on the backend ortft trained with
    False: """from transformers import AutoImageProcessor

processor = AutoImageProcessor.from_pretrained(".", backend="pil")
pixel_values = processor(images=[image], return_tensors="np")["pixel_values"]
""",
}
_RUN = """logits = session.run(["logits"], {"pixel_values": pixel_values})[0]
print(config["id2label"][str(logits[0].argmax())])
"""
_SESSION = '{name} = ort.InferenceSession("{file}", providers=["CPUExecutionProvider"])'


def snippet(with_preprocess: bool) -> str:
    """The card's snippet: preprocess.onnx then model.onnx, or (no preprocess.onnx) the image
    processor then model.onnx."""
    sessions = [_SESSION.format(name="session", file=MODEL)]
    if with_preprocess:
        sessions.insert(0, _SESSION.format(name="preprocess", file=PREPROCESS))
    head = _HEAD.format(sessions="\n".join(sessions), image=json.dumps(CARD_IMAGE))
    return head + _PIXELS[with_preprocess] + _RUN


def card(report: ExportReport) -> tuple[str, str, str, str]:
    """The card's (snippet, what else the folder holds, the preprocessing line, what the
    snippet needs): ``deploy.write_card``."""
    pre = report["preprocess"]
    code = snippet(PREPROCESS in report["files"].values())
    holds = "the image processor (`preprocessor_config.json`, transformers' PIL backend)"
    if not pre.get("exported"):
        line = (
            f"- **Preprocessing:** no `{PREPROCESS}` ({pre['reason']}): run the image "
            'processor, loaded with `backend="pil"` (what training used), to get `pixel_values`.'
        )
        return code, holds, line, "`onnxruntime`, `numpy`, `Pillow` and `transformers`"
    line = (
        f"- **Preprocessing:** `{PREPROCESS}` takes the decoded RGB image (`image`, uint8 "
        "[height, width, 3], any size) and gives the model's `pixel_values` "
        f"({pre['output'].split(': ', 1)[1]}) as the image processor does: checked on "
        f"{pre['images']} images, max |diff| {pre['max_abs_diff']:.2e} (at most one pixel "
        f"step: {pre['tolerance']:.2e}). Decode with Pillow and convert to RGB as below "
        "(alpha over white)."
    )
    return code, holds, line, "`onnxruntime`, `numpy` and `Pillow`"
