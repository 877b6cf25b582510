"""The report and result types of ``ortft/core/reports.py`` name every key that the JSON has:
mypy checks the keys the code writes by name, this checks what reaches the JSON another way
(an entry read back from a subprocess, a section built up key by key). A tiny classifier folder
is exported with its int8 variant, then predicted and evaluated on the export."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import save_pretrained_classifier, write_classification_csv
from typer.testing import CliRunner

from ortft.cli.app import app
from ortft.core.reports import (
    EvalResult,
    ExportReport,
    ParityReport,
    Prediction,
    RuntimeReport,
    TokenizerReport,
)

TEXTS = ["great fun movie loved it", "boring dull terrible plot", "the cat sat on a mat"] * 10


def _keys(shape: type) -> set[str]:
    return set(shape.__required_keys__) | set(shape.__optional_keys__)  # type: ignore[attr-defined]


def _json(*args: object) -> object:
    res = CliRunner().invoke(app, [str(a) for a in args])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_export_predict_and_eval_json_keys_are_typed(tmp_path: Path):
    folder = save_pretrained_classifier(tmp_path / "bert", TEXTS, max_positions=128)
    out = tmp_path / "onnx"
    returned = _json("export", folder, "-o", out, "--quantize", "int8", "--json")
    written = json.loads((out / "export.json").read_text())
    assert isinstance(returned, dict)
    assert set(returned) <= _keys(ExportReport)
    assert set(written) <= set(returned)
    assert set(written["parity"]) <= _keys(ParityReport)
    assert set(written["tokenizer"]) == _keys(TokenizerReport)
    assert all(set(r) <= _keys(RuntimeReport) for r in written["runtimes"])

    (tmp_path / "in.txt").write_text("loved it\nterrible plot\n")
    res = CliRunner().invoke(
        app, ["predict", str(out), "--input", str(tmp_path / "in.txt"), "--json"]
    )
    assert res.exit_code == 0, res.output
    predictions = [json.loads(line) for line in res.stdout.splitlines()]
    assert len(predictions) == 2
    assert all(set(p) <= _keys(Prediction) for p in predictions)

    data = write_classification_csv(tmp_path / "eval.csv", n=16)
    result = _json("eval", out, "--data", data, "--json")
    assert isinstance(result, dict)
    assert set(EvalResult.__required_keys__) <= set(result) <= _keys(EvalResult)
