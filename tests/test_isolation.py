"""Every run a test starts uses the test session's own ortft cache, never the user's
~/.cache/ortft: module and session fixtures too, which pytest sets up before any
function-scoped fixture (a module fixture's DPO run once read the user's cache while the test's
own runs read the session's, and their reference log-probs came from different runs), and
after a test whose ``datasets.map(num_proc=...)`` replaced ``os.environ`` (conftest's
``_environ_object_kept``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def cache_in_a_module_fixture() -> str | None:
    return os.environ.get("ORTFT_CACHE")


def test_module_fixtures_and_tests_use_the_session_cache(
    cache_in_a_module_fixture: str | None, tmp_path_factory: pytest.TempPathFactory
) -> None:
    session = str(tmp_path_factory.getbasetemp() / "ortft-cache")
    assert cache_in_a_module_fixture == session
    assert os.environ.get("ORTFT_CACHE") == session
    assert not Path(session).is_relative_to(Path.home() / ".cache")
