"""The CLI answers --help and --version, and importing it stays light (no torch)."""

from __future__ import annotations

import json
import subprocess
import sys

from helpers import run_cli
from typer.testing import CliRunner

from ortft import __version__
from ortft.cli.app import app

runner = CliRunner()


def test_help_lists_the_commands():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0, result.output
    for command in ("train", "validate", "doctor", "export"):
        assert command in result.stdout


def test_version():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.stdout.strip() == f"ortft {__version__}"


def test_doctor_help():
    result = runner.invoke(app, ["doctor", "--help"])
    assert result.exit_code == 0
    assert "--json" in result.stdout and "--fix" in result.stdout


def test_unknown_command_is_a_usage_error():
    result = runner.invoke(app, ["no-such-command"])
    assert result.exit_code == 2


def test_importing_the_cli_does_not_import_heavy_libraries():
    code = (
        "import json, sys, ortft.cli.app\n"
        "heavy = ['torch', 'onnxruntime', 'transformers', 'onnx', 'datasets', 'numpy']\n"
        "print(json.dumps([m for m in heavy if m in sys.modules]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


def test_version_from_a_fresh_process():
    out = run_cli("--version", timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"ortft {__version__}"


def test_torch_cpp_extension_notices_are_quiet_unless_debug():
    """A CUDA build of torch on a machine without a GPU logs "No CUDA runtime is found"
    through this logger (older torch printed it): hidden like other library chatter."""
    code = (
        "import logging, sys\n"
        "from ortft.cli.output import quiet_libraries\n"
        "quiet_libraries(sys.argv[1] == 'debug')\n"
        "logging.getLogger('torch.utils.cpp_extension').warning('No CUDA runtime is found')\n"
    )
    for mode, shown in (("quiet", False), ("debug", True)):
        argv = [sys.executable, "-c", code, mode]
        out = subprocess.run(argv, capture_output=True, text=True, check=True)
        assert ("No CUDA runtime is found" in out.stderr) is shown, (mode, out.stderr)
