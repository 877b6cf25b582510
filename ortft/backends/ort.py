"""ONNX Runtime training through ORTModule, with a strict fallback policy.

ORTModule quietly runs plain PyTorch when it cannot export a model or flatten its outputs.
Here that is an error unless ``backend.allow_fallback`` is set; then it is a loud warning and
is recorded in the run summary. Exports are counted by wrapping ORTModule's own export
function, so a re-export on every step (a shape that keeps changing) shows in the summary.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
from pathlib import Path
from typing import Any

from torch import nn

from ortft.backends import BackendReport
from ortft.errors import BackendError

log = logging.getLogger("ortft")

_EXPORTS = {"count": 0}


def _install_export_counter() -> None:
    """Count every torch -> ONNX export ORTModule performs (once per process)."""
    from onnxruntime.training.ortmodule import _graph_transition_manager as gtm

    cls = gtm.GraphTransitionManager
    if getattr(cls._export_model, "_ortft_counted", False):
        return
    original = cls._export_model

    def counted(*args: Any, **kwargs: Any) -> Any:
        _EXPORTS["count"] += 1
        return original(*args, **kwargs)

    counted._ortft_counted = True  # type: ignore[attr-defined]
    cls._export_model = staticmethod(counted)


def export_count() -> int:
    return _EXPORTS["count"]


class OrtBackend:
    name = "ort"
    # ORTModule cannot build gradients for sdpa attention (measured, torch 2.6 / ORT 1.19)
    attn_implementation = "eager"

    def __init__(self, options: Any):
        self.options = options
        self._report = BackendReport(requested="ort", used="ort")
        self._start_exports = 0
        self._checked = False

    def _configure_env(self, run_dir: Path) -> None:
        # ORTModule reads these when it is constructed; set them before importing it.
        o = self.options
        if o.allow_fallback:
            os.environ.pop("ORTMODULE_FALLBACK_POLICY", None)  # ORTModule's default: fall back
        else:
            os.environ["ORTMODULE_FALLBACK_POLICY"] = "FALLBACK_DISABLE"
        os.environ["ORTMODULE_LOG_LEVEL"] = o.log_level
        os.environ["ORTMODULE_MEMORY_OPT_LEVEL"] = str(o.memory_optimization_level)
        os.environ["ORTMODULE_ENABLE_COMPUTE_OPTIMIZER"] = "1" if o.compute_optimizer else "0"
        if o.save_onnx:
            path = run_dir / "ort_graphs"
            path.mkdir(parents=True, exist_ok=True)
            os.environ["ORTMODULE_SAVE_ONNX_PATH"] = str(path)

    def wrap(self, module: nn.Module, run_dir: Path) -> nn.Module:
        self._configure_env(run_dir)
        try:
            # torch's cpp_extension prints a CUDA_HOME notice on CPU machines: not ours to show
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                from onnxruntime.training.ortmodule import DebugOptions, LogLevel, ORTModule
        except Exception as err:  # noqa: BLE001 - an import failure is the most common setup bug
            raise BackendError(
                f"cannot import ORTModule ({type(err).__name__}: {err}); run `ortft doctor`"
            ) from None
        _install_export_counter()
        self._start_exports = export_count()
        debug = DebugOptions(
            log_level=getattr(LogLevel, self.options.log_level),
            save_onnx=self.options.save_onnx,
            onnx_prefix="ortft" if self.options.save_onnx else "",
        )
        wrapped = ORTModule(module, debug)
        if type(wrapped._torch_module).__name__ == "TorchModulePytorch":
            self._fell_back("ORTModule could not initialise for this model")
        return wrapped

    def _fell_back(self, reason: str) -> None:
        if not self.options.allow_fallback:
            raise BackendError(
                f"ONNX Runtime could not run this model ({reason}); "
                "set backend.name=torch, or backend.allow_fallback=true to fall back to PyTorch"
            )
        if not self._report.fallback:
            log.warning("FALLBACK: training with PyTorch, not ONNX Runtime: %s", reason)
        self._report.fallback = True
        self._report.used = "torch"
        self._report.fallback_reason = reason

    def after_step(self, wrapped: nn.Module) -> None:
        if self._checked and not self._report.fallback:
            return
        self._checked = True
        torch_module = wrapped._torch_module
        if type(torch_module).__name__ == "TorchModulePytorch":
            self._fell_back("ORTModule initialisation failed")
            return
        manager = torch_module._execution_manager(wrapped.training)
        pending = manager._fallback_manager._exception
        if pending is not None:
            self._fell_back(f"{type(pending).__name__}: {str(pending).strip().splitlines()[0][:300]}")
        elif export_count() == self._start_exports:
            # Nothing was exported, yet the step ran: ORT was not in the loop.
            self._fell_back("ORTModule ran no exported graph")

    def report(self) -> BackendReport:
        self._report.ort_exports = export_count() - self._start_exports
        return self._report
