"""What the ``ortft`` commands print: results on stdout, errors and the libraries' chatter on stderr.

Kept apart from the command modules so each command stays a short function; like them, it
imports no heavy library at module level.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import typer

from ortft.run.summary import RunSummary


def err(message: str) -> None:
    """One error line on stderr."""
    sys.stderr.write(f"error: {message}\n")
    sys.stderr.flush()


def echo_json(obj: Any) -> None:
    typer.echo(json.dumps(obj, indent=2))


def emit_summary(
    summary: RunSummary | Mapping[str, Any] | None, as_json: bool, report: list[Path] | None
) -> None:
    """stdout: the summary JSON (--json) or the run path; plus any --report files."""
    from ortft.tools import ci_report

    s = RunSummary.coerce(summary) if summary else None
    if report:
        ci_report.write(report, s or {})
    if as_json:
        echo_json(s.to_dict() if s else {})
    elif s is not None and s.paths.run_dir:
        typer.echo(s.paths.run_dir)


def report_failed_run(report: list[Path] | None, run_dir: Path) -> None:
    """--report for a failed or interrupted run, from the summary.json it left (if any)."""
    from ortft.tools import ci_report

    path = run_dir / "summary.json"
    if report and path.exists():  # from_dict, not read: any format_version still gets a report
        ci_report.write(report, RunSummary.from_dict(json.loads(path.read_text())))


def quiet_libraries(debug: bool, with_torch: bool = True) -> None:
    """Our own progress on stderr; the libraries' chatter only with --debug.

    ``with_torch=False``: leave PyTorch unimported (backend.name=ort-ondevice trains without it)."""
    import logging
    import os
    import warnings

    from ortft.core.progress import setup_logging

    setup_logging(logging.DEBUG if debug else logging.INFO)
    if "DS_ACCELERATOR" not in os.environ:
        # onnxruntime-training (ORTModule) and accelerate import DeepSpeed whenever it is
        # installed (make setup installs it), in runs without a deepspeed section too, and
        # DeepSpeed announces a guessed accelerator on stdout, where results go: name it instead
        # (the PyTorch engine sets the run's device when it starts; on-device runs need none)
        os.environ["DS_ACCELERATOR"] = _visible_accelerator() if with_torch else "cpu"
    if not debug:
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        warnings.filterwarnings("ignore")
        import contextlib
        import io

        if with_torch:  # an edge device training ONNX artifacts may have neither library
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()  # "Loading weights" bars; ortft shows its own
            # torch's cpp_extension gives a CUDA_HOME notice on GPU-less machines at import:
            # printed by older torch, logged as a warning by newer (and again when asked later)
            logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
            with contextlib.redirect_stderr(io.StringIO()):
                import torch.utils.cpp_extension  # noqa: F401


def _visible_accelerator() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
