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
    before = helpers._SERVER.forks
    done = run_cli(*args, **kw)
    assert helpers._SERVER.forks == before + 1  # it went through a server, not a fresh process
    return done


def _server(env: dict[str, str]) -> helpers._ForkServer:
    return helpers._SERVER.servers[helpers.import_env(helpers.forked_env(env))]


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
    with pytest.raises(ProcessLookupError):
        os.kill(_server(dict(os.environ)).last_pid, 0)  # killed and reaped


def test_an_import_time_variable_gets_its_own_server() -> None:
    """A run that changes what the imports read (here an HF_ variable no other test sets) forks
    from a server imported under it; the least recently used server beyond MAX_SERVERS ends."""
    _forked("--version")
    default = _server(dict(os.environ))
    runs = default.runs
    _forked("--version", env={"HF_FORKSERVER_TEST": "1"})
    assert default.runs == runs  # not forked from the default server
    own = _server({**os.environ, "HF_FORKSERVER_TEST": "1"})
    assert own is not default and own.runs == 1
    _forked("--version", env={"NO_COLOR": "1", "ORTFT_CACHE": os.environ.get("ORTFT_CACHE", "")})
    assert default.runs == runs + 1  # other variables do not need a server of their own
    _forked("--version", env={"HF_FORKSERVER_TEST": "2"})
    assert len(helpers._SERVER.servers) == helpers.MAX_SERVERS
    assert own.proc.poll() is not None  # the least recently used ended
