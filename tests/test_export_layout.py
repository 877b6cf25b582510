"""The Hub layout of an export folder (``ortft.export.layout``): ``onnx/model.onnx`` is a
relative link to the root ``model.onnx`` (transformers.js reads the first, Optimum and ortft
the second), external data is linked beside it, export.json lists the links apart from its
files, and a file system without links leaves the root folder whole. transformers.js itself
opens the folder in the consumer tier (tests/test_consumer.py, ``test_transformers_js``)."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_export import _save_tiny

from ortft.export import layout
from ortft.tools.export_source import export_source


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _save_tiny(tmp_path_factory.mktemp("layout") / "model", "bert")


@pytest.fixture(scope="module")
def exported(tiny: Path) -> tuple[Path, dict[str, Any]]:
    """``ortft export`` of a tiny BERT classifier (the CLI's function, in-process)."""
    out = tiny.parent / "out"
    export_source(tiny, out, opset=20, tolerance=1e-4)
    return out, json.loads((out / "export.json").read_text())


def _logits(path: Path) -> np.ndarray:
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ids = np.array([[2, 7, 9, 11, 3]], dtype=np.int64)
    return sess.run(["logits"], {"input_ids": ids, "attention_mask": np.ones_like(ids)})[0]


def test_link_is_relative_and_opens(exported: tuple[Path, dict[str, Any]]) -> None:
    out, _ = exported
    link = out / "onnx" / "model.onnx"
    assert link.is_symlink() and os.readlink(link) == "../model.onnx"
    assert link.resolve() == (out / "model.onnx").resolve()
    assert not (out / "model.onnx").is_symlink()  # the root file is the one copy
    np.testing.assert_array_equal(_logits(link), _logits(out / "model.onnx"))


def test_manifest_lists_the_link_apart(exported: tuple[Path, dict[str, Any]]) -> None:
    """export.json: ``links`` names it; ``files`` (what a reader copies or hashes) does not,
    and the folder holds one model.onnx's bytes."""
    out, report = exported
    assert report["links"] == {"onnx/model.onnx": "model.onnx"}
    assert report["files"] == {"model": "model.onnx", "card": "README.md"}
    real = [p for p in out.rglob("*.onnx") if not p.is_symlink()]
    assert real == [out / "model.onnx"]


def test_failed_export_has_the_link_too(tiny: Path) -> None:
    """OUT.failed (a check failed: here a tolerance nothing meets) is laid out the same."""
    out = tiny.parent / "strict"
    with pytest.raises(Exception, match="export check failed"):
        export_source(tiny, out, opset=20, tolerance=-1.0)
    failed = out.with_name("strict.failed")
    assert not out.exists() and os.readlink(failed / "onnx" / "model.onnx") == "../model.onnx"
    assert json.loads((failed / "export.json").read_text())["links"] == {
        "onnx/model.onnx": "model.onnx"
    }
    assert _logits(failed / "onnx" / "model.onnx").shape == (1, 2)


def test_external_data_is_linked_beside_it(
    exported: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    """onnxruntime reads external data beside the path it opens (onnx/), not the target's."""
    import onnx

    out, _ = exported
    model = onnx.load(str(out / "model.onnx"))
    onnx.save(model, str(tmp_path / "model.onnx"), save_as_external_data=True,
              location="model.onnx.data", size_threshold=0)  # fmt: skip
    links = layout.hub_links(tmp_path)
    assert links == {"onnx/model.onnx": "model.onnx", "onnx/model.onnx.data": "model.onnx.data"}
    assert os.readlink(tmp_path / "onnx" / "model.onnx.data") == "../model.onnx.data"
    np.testing.assert_array_equal(
        _logits(tmp_path / "onnx" / "model.onnx"), _logits(out / "model.onnx")
    )


def test_no_links_where_the_file_system_has_none(
    exported: tuple[Path, dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No symlinks (a FAT drive, Windows without the privilege): no onnx/, no ``links``, the
    root folder still whole; a folder without a root model.onnx (seq2seq) gets none either."""
    out, _ = exported
    (tmp_path / "model.onnx").write_bytes((out / "model.onnx").read_bytes())

    def refuse(*_: object) -> None:
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(layout.os, "symlink", refuse)
    assert layout.hub_links(tmp_path) == {}
    assert not (tmp_path / "onnx").exists() and _logits(tmp_path / "model.onnx").shape == (1, 2)
    assert layout.hub_links(tmp_path / "onnx") == {}  # no model.onnx there


def test_variants_are_linked_under_transformers_js_names(tiny: Path) -> None:
    """``--fp16 --quantize int8``: each variant is linked in onnx/ under the file name
    transformers.js's dtype picks (fp16 -> model_fp16.onnx; q8 -> model_quantized.onnx, int8 ->
    model_int8.onnx), relative to the root file, listed in ``links`` and not in ``files``."""
    out = tiny.parent / "variants"
    export_source(tiny, out, opset=20, tolerance=1e-4, fp16=True, quantize="int8")
    report = json.loads((out / "export.json").read_text())
    want = {
        "onnx/model.onnx": "model.onnx",
        "onnx/model_fp16.onnx": "model.fp16.onnx",
        "onnx/model_quantized.onnx": "model.int8.onnx",
        "onnx/model_int8.onnx": "model.int8.onnx",
    }
    assert report["links"] == want
    assert not set(report["files"].values()) & {
        Path(k).name for k in want if k != "onnx/model.onnx"
    }
    for link, target in want.items():
        assert os.readlink(out / link) == f"../{target}", link
        np.testing.assert_array_equal(_logits(out / link), _logits(out / target))


def test_an_int4_root_file_is_linked_as_q4(
    exported: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    """``model.int4.onnx`` at the root (``--quantize int4``) is transformers.js's "q4"."""
    out, _ = exported
    for name in ("model.onnx", "model.int4.onnx"):
        (tmp_path / name).write_bytes((out / "model.onnx").read_bytes())
    links = layout.hub_links(tmp_path)
    assert links == {"onnx/model.onnx": "model.onnx", "onnx/model_q4.onnx": "model.int4.onnx"}
    assert os.readlink(tmp_path / "onnx" / "model_q4.onnx") == "../model.int4.onnx"
