"""The suite's own rules (tests/conftest.py), each shown to bite: the Hub is offline for every
test and every process a test starts, a skip whose reason is not allowed fails the session, and
property tests draw the same examples every run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import (
    HUB_OFFLINE,
    TIER_MARKERS,
    selected_tier,
    tiny_classifier,
    write_classification_csv,
    write_recipe,
)
from helpers import run_cli

TESTS = Path(__file__).resolve().parent


def test_the_hub_is_offline_here_and_in_child_processes() -> None:
    assert {k: os.environ.get(k) for k in HUB_OFFLINE} == HUB_OFFLINE
    code = (
        "import json, huggingface_hub.constants as h, datasets.config as d; "
        "print(json.dumps([h.HF_HUB_OFFLINE, d.HF_HUB_OFFLINE]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert json.loads(out.stdout) == [True, True]


def test_a_recipe_naming_a_hub_model_is_one_line_when_offline(tmp_path: Path) -> None:
    write_classification_csv(tmp_path / "train.csv")
    recipe = tiny_classifier("train.csv")
    recipe["model"] = {"name_or_path": "google-bert/bert-base-uncased"}
    path = write_recipe(tmp_path / "hub.yaml", recipe)
    res = run_cli("train", path, "--output-dir", tmp_path / "run", env={"NO_COLOR": "1"})
    assert res.returncode == 2, res.stderr[-2000:]
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "google-bert/bert-base-uncased" in errors[0], res.stderr
    assert "Traceback" not in res.stderr and "Retrying" not in res.stderr


def _pythonpath() -> list[str]:
    return [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]


def _inner_session(folder: Path, body: str, *args: str) -> subprocess.CompletedProcess[str]:
    """pytest on one test file holding ``body``, with this suite's conftest as a plugin."""
    (folder / "test_inner.py").write_text(body)
    plugins = ["-p", "conftest", "-p", "no:cacheprovider"]
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", *plugins, "--rootdir", str(folder), "-c", os.devnull]
        + [*args, str(folder / "test_inner.py")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=folder,
        # the caller's PYTHONPATH too: it may be what makes ortft importable (conftest needs it)
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), *_pythonpath()])},
    )


def test_a_skip_fails_the_session_unless_its_reason_is_allowed(tmp_path: Path) -> None:
    allowed = (
        "import pytest\n"
        "def test_gpu():\n    pytest.skip('needs a CUDA GPU')\n"
        "def test_runs():\n    pass\n"
    )
    res = _inner_session(tmp_path, allowed)
    assert res.returncode == 0, res.stdout[-2000:]
    missing = allowed + "def test_install():\n    pytest.importorskip('no_such_package_here')\n"
    res = _inner_session(tmp_path, missing)
    assert res.returncode == 1, res.stdout[-2000:]
    assert "skips that are not allowed" in res.stdout
    assert "test_inner.py::test_install: could not import 'no_such_package_here'" in res.stdout


def test_a_test_marked_ort_skips_without_ort_training_and_runs_with_it(tmp_path: Path) -> None:
    """The current profile skips it, saying why (its CI tier deselects it with -m "not ort");
    the ort profile runs it, and there no test may skip for want of ORT training."""
    from conftest import NO_ORT_TRAINING

    from ortft.env import ort_training

    body = "import pytest\n@pytest.mark.ort\ndef test_ort():\n    open('ran', 'w').close()\n"
    res = _inner_session(tmp_path, body, "-rs")
    assert res.returncode == 0, res.stdout[-2000:]
    if ort_training.installed() is None:
        assert not (tmp_path / "ran").exists()
        assert f"SKIPPED [1] test_inner.py:2: {NO_ORT_TRAINING}" in res.stdout, res.stdout
        return
    assert (tmp_path / "ran").is_file() and "skipped" not in res.stdout
    skipping = f"import pytest\ndef test_ort():\n    pytest.skip({NO_ORT_TRAINING!r})\n"
    res = _inner_session(tmp_path, skipping)
    assert res.returncode == 1 and "skips that are not allowed" in res.stdout, res.stdout


def test_property_tests_draw_the_same_examples_every_run(tmp_path: Path) -> None:
    body = (
        "from hypothesis import given, strategies as st\n"
        "@given(st.integers())\n"
        "def test_draws(x):\n"
        "    with open('drawn.txt', 'a') as fh:\n"
        "        fh.write(f'{x}\\n')\n"
    )
    draws = []
    for _ in range(2):
        (tmp_path / "drawn.txt").unlink(missing_ok=True)
        res = _inner_session(tmp_path, body)
        assert res.returncode == 0, res.stdout[-2000:]
        draws.append((tmp_path / "drawn.txt").read_text())
    assert draws[0] == draws[1] and len(draws[0].splitlines()) > 10


def test_a_tier_collects_only_the_files_that_apply_its_marker() -> None:
    """conftest's pytest_ignore_collect: `-m "learn and not gpu"` reads only files with
    `mark.learn`; an expression that admits other tests collects everything."""
    assert selected_tier("learn and not gpu") == "learn"
    assert selected_tier("consumer") == "consumer"
    for admits_more in ("not slow and not learn", "learn or consumer", "(archs) and x", ""):
        assert selected_tier(admits_more) is None
    # the filter reads each file for `mark.<tier>`: a marker added by conftest's hooks to
    # other files' tests, or through getattr, would go unseen
    conftest = (TESTS / "conftest.py").read_text()
    assert not [tier for tier in TIER_MARKERS if f"pytest.mark.{tier}" in conftest]
    others = [p for p in TESTS.glob("*.py") if p.name != Path(__file__).name]
    assert not [p.name for p in others if "getattr(pytest.mark" in p.read_text()]
