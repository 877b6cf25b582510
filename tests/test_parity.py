"""ortft.export.parity: one pass rule set for every export (PyTorch or ONNX source)."""

from __future__ import annotations

import numpy as np
import pytest

from ortft.core.errors import InputError
from ortft.export import parity


def _reduced(agreement: float, delta: float, against: str) -> dict:
    return {
        "prediction_agreement": agreement,
        "accuracy_delta": delta,
        "accuracy_against": against,
        "max_abs_diff": 0.5,  # never what a reduced-precision variant is judged by
    }


def test_full_precision_is_judged_by_max_abs_diff() -> None:
    for kind in ("parity", "optimize"):
        assert parity.passed(kind, {"max_abs_diff": 1e-5, "tolerance": 1e-4})
        assert not parity.passed(kind, {"max_abs_diff": 2e-4, "tolerance": 1e-4})


@pytest.mark.parametrize("kind", ["fp16", "int8"])
def test_reduced_precision_is_judged_by_agreement_and_accuracy_drop(kind: str) -> None:
    limit = parity.THRESHOLDS[kind]
    ok, low = limit["min_agreement"], limit["min_agreement"] - 0.01
    drop = limit["max_accuracy_drop"]
    assert parity.passed(kind, _reduced(ok, 0.0, "labels"))
    assert not parity.passed(kind, _reduced(low, 0.0, "labels"))
    # with labels, the accuracy drop is gated as well ...
    assert not parity.passed(kind, _reduced(ok, -(drop + 0.005), "labels"))
    # ... without labels the "accuracy" is the agreement again: only the agreement counts
    assert parity.passed(kind, _reduced(ok, -(drop + 0.005), "fp32 predictions"))


def test_failures_name_every_failed_section_in_report_order() -> None:
    result = {
        "parity": {"passed": False, "max_abs_diff": 2e-3, "tolerance": 1e-4},
        "optimize": {"passed": True},
        "int8": {**_reduced(0.5, -0.25, "labels"), "passed": False},
        "training": {"check": {"passed": False, "losses": [1.0, 1.1, 1.2]}},
    }
    parity.finish(result)
    assert result["passed"] is False
    assert result["failures"] == [
        "parity: max |diff| 2.00e-03 > 0.0001",
        "int8: agreement 0.500 (min 0.9), accuracy delta -0.250 (max drop 0.02)",
        "training artifacts: loss did not fall [1.0, 1.1, 1.2]",
    ]


def test_wanted_variants_and_the_one_quantize_check() -> None:
    assert parity.wanted(True, True, "int8") == ["optimize", "fp16", "int8"]
    assert parity.wanted(False, False, None) == []
    assert parity.wanted(False, False, "int4") == ["int4"]
    with pytest.raises(InputError, match="--quantize int2: choose one of int8, int4"):
        parity.wanted(False, False, "int2")


def test_judge_counts_next_token_predictions() -> None:
    logits = np.zeros((1, 3, 4), np.float32)
    logits[0, 0, 2] = logits[0, 1, 3] = 1.0  # predicts 2 then 3
    feeds = {"input_ids": np.array([[1, 2, 0]]), "attention_mask": np.array([[1, 1, 0]])}
    j = parity.judge(logits, logits, feeds, "next-token")
    assert j["prediction_agreement"] == 1.0 and j["max_abs_diff"] == 0.0
    assert j["accuracy_against"] == "fp32 predictions"
