"""helpers.run_cli's fork server (tests/forkserver.py) gives what a fresh `python -m ortft` gives:
output, exit code, working directory, stdin, a timeout that kills the run; and it hands a run
that changes an import-time variable to a fresh process."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import helpers
import pytest
from helpers import run_cli

BAD_RECIPE = "model:\n  from_config: {architecture: gpt2}\ntask: text-classification\nnonsense: 1\n"


def _forked(*args: str, **kw) -> subprocess.CompletedProcess[str]:
    before = helpers._SERVER.server.runs if helpers._SERVER.server else 0
    done = run_cli(*args, **kw)
    assert helpers._SERVER.server is not None and helpers._SERVER.server.runs == before + 1
    return done


def test_a_forked_run_gives_what_a_fresh_process_gives(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "bad.yaml").write_text(BAD_RECIPE)
    cases = [("--version",), ("validate", "bad.yaml"), ("no-such-command",)]
    forked = [_forked(*args, cwd=tmp_path) for args in cases]
    monkeypatch.setenv("ORTFT_TEST_FORK", "0")
    fresh = [run_cli(*args, cwd=tmp_path) for args in cases]
    for args, a, b in zip(cases, forked, fresh, strict=True):
        assert (a.returncode, a.stdout, a.stderr) == (b.returncode, b.stdout, b.stderr), args
    assert [f.returncode for f in forked] == [0, 2, 2]
    assert "nonsense" in forked[1].stderr  # the relative path was read from cwd


def test_stdin_environment_and_check_reach_the_child(tmp_path: Path) -> None:
    recipe = Path(__file__).resolve().parents[1] / "recipes" / "quickstart.yaml"
    done = _forked("validate", str(recipe), env={"ORTFT_SOME_SETTING": "1"}, input="ignored\n")
    assert done.returncode == 0, done.stderr
    with pytest.raises(subprocess.CalledProcessError) as err:
        _forked("validate", "missing.yaml", cwd=tmp_path, check=True)
    assert err.value.returncode == 2 and "missing.yaml" in err.value.stderr


def test_a_timeout_kills_the_forked_run(tmp_path: Path) -> None:
    recipe = Path(__file__).resolve().parents[1] / "recipes" / "causal-lm.yaml"
    with pytest.raises(subprocess.TimeoutExpired):
        run_cli("train", recipe, "-o", tmp_path / "run", timeout=1)
    assert helpers._SERVER.server is not None
    with pytest.raises(ProcessLookupError):
        os.kill(helpers._SERVER.server.last_pid, 0)  # killed and reaped


def test_an_import_time_variable_starts_a_fresh_process() -> None:
    server = helpers._SERVER.server or _forked("--version") and helpers._SERVER.server
    assert server is not None
    assert server.can_run({**server.env, "ORTFT_CACHE": "/elsewhere", "NO_COLOR": "1"})
    for name in ("OMP_NUM_THREADS", "HF_HOME", "PYTHONPATH", "CUDA_VISIBLE_DEVICES", "HOME"):
        assert not server.can_run({**server.env, name: "x"}), name
    runs = server.runs
    assert run_cli("--version", env={"OMP_NUM_THREADS": "1"}).returncode == 0
    assert server.runs == runs
