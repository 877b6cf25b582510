"""The Hugging Face Hub layout beside ortft's own, so that the common consumers open an export
folder as it is: Optimum's ``ORTModel*`` (and ortft) read ``model.onnx`` at the root,
transformers.js (``@huggingface/transformers``) reads ``onnx/model.onnx`` next to the root's
``config.json`` and ``tokenizer.json``.

The root file stays the one copy: ``onnx/model.onnx`` is a relative link to ``../model.onnx``
(a 90 MB MiniLM is not written twice), and so is each external-data file the graph names, since
onnxruntime looks for external data beside the path it is given (``onnx/``), not beside the
link's target. A folder copied where links are not kept (``shutil.copytree`` without
``symlinks=True`` copies the file; a file system without links gets none) loses nothing: the
root is canonical. export.json lists the links under ``links`` ({link: the file it points to},
both relative to the folder), not under ``files``: a reader that copies or hashes ``files``
sees each file once.

Each graph at the root is linked under the names transformers.js opens (``HUB_NAMES``): the
fp32 ``model.onnx`` (``dtype: "fp32"``), or an encoder-decoder's (seq2seq, speech)
``encoder_model.onnx`` and ``decoder_model_merged.onnx``; and each variant under the name its
``dtype`` picks (its DEFAULT_DTYPE_SUFFIX_MAPPING, transformers.js 4.3): ``model.fp16.onnx`` as
``model_fp16.onnx`` ("fp16"), ``model.int8.onnx`` (dynamic quantization, int8 weights) as
``model_quantized.onnx`` ("q8", the quantized default) and ``model_int8.onnx`` ("int8"),
``model.int4.onnx`` (weight-only 4-bit) as ``model_q4.onnx`` ("q4"). ``model.opt.onnx`` has no
such name: it is ORT's own CPU graph.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from ortft.core.reports import ExportReport

log = logging.getLogger("ortft")

HUB_DIR = "onnx"  # transformers.js: <model>/onnx/model.onnx for dtype "fp32"
MODEL = "model.onnx"
# a root file -> its names in onnx/: transformers.js's fp32 graphs, and each variant under the
# name of its dtype of the same precision
HUB_NAMES = {
    MODEL: ("model.onnx",),  # "fp32"
    "encoder_model.onnx": ("encoder_model.onnx",),  # an encoder-decoder's, "fp32"
    "decoder_model_merged.onnx": ("decoder_model_merged.onnx",),
    "model.fp16.onnx": ("model_fp16.onnx",),  # "fp16"
    "model.int8.onnx": ("model_quantized.onnx", "model_int8.onnx"),  # "q8", "int8"
    "model.int4.onnx": ("model_q4.onnx",),  # "q4"
}


def external_files(path: Path) -> list[str]:
    """The external-data files ``path``'s initializers name (``model.onnx.data``, or torch's
    one file per tensor for a graph over 2 GB), relative to its folder; [] for most exports."""
    import onnx

    # the graph without its external data: 0.14 s for the quickstart's 90 MB model.onnx
    model = onnx.load(str(path), load_external_data=False)
    names = {
        e.value
        for t in model.graph.initializer
        if t.data_location == onnx.TensorProto.EXTERNAL
        for e in t.external_data
        if e.key == "location"
    }
    # a location outside the folder is not linked: a link is made only where it stays inside
    return sorted(n for n in names if not Path(n).is_absolute() and ".." not in Path(n).parts)


def hub_links(folder: Path) -> dict[str, str]:
    """Link each root graph of ``HUB_NAMES`` (and its external data) under its names in
    ``folder/onnx/``; returns export.json's ``links``. {} when the folder has none of them or
    its file system makes no links (a one-line warning; the root files are all a consumer of
    the root graphs needs)."""
    hub = folder / HUB_DIR
    links: dict[str, str] = {}
    for root, names in HUB_NAMES.items():
        if (folder / root).is_file():
            links.update({f"{HUB_DIR}/{name}": root for name in names})
            links.update({f"{HUB_DIR}/{f}": f for f in external_files(folder / root)})
    if not links:
        return {}
    try:
        make_links(folder, links)
    except OSError as err:
        log.warning(
            "%s: no %s/ links for transformers.js (%s); the root %s is complete",
            folder,
            HUB_DIR,
            err.strerror or err,
            " and ".join(dict.fromkeys(links.values())),
        )
        shutil.rmtree(hub, ignore_errors=True)  # the links only: never their targets
        return {}
    return links


def make_links(folder: Path, links: dict[str, str]) -> None:
    """Each ``link`` of ``links`` ({link: target}, both relative to ``folder``) as a relative
    symbolic link to its target; OSError where the file system makes none."""
    for link, target in links.items():
        (folder / link).parent.mkdir(parents=True, exist_ok=True)
        up = "../" * link.count("/")  # a tensor file may sit in a subfolder of its own
        os.symlink(up + target, folder / link)


def with_links(folder: Path, result: ExportReport) -> ExportReport:
    """``result`` (export.json) after :func:`hub_links`, beside the links an earlier step made
    (a decoder's ``int4/`` folder for onnxruntime-genai): the last step of every folder made
    ready for clients (``exporter.deployable``, the embedding family's own)."""
    links = {**result.get("links", {}), **hub_links(folder)}
    if links:
        result["links"] = links
    return result
