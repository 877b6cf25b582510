"""ONNX Runtime training through ORTModule, with a strict fallback policy.

ORTModule quietly runs plain PyTorch when it cannot export a model or flatten its outputs.
Here that is an error unless ``backend.allow_fallback`` is set; then it is a loud warning and
is recorded in the run summary. Exports are counted by wrapping ORTModule's own export
function, so a re-export on every step (a shape that keeps changing) shows in the summary.

ORTModule builds its ``SessionOptions`` itself and exposes no knob for threads or spinning.
ortft wraps that one method to apply the session settings below (measured by ``ortft bench``;
the defaults are in ``SESSION_DEFAULTS``). Each can be overridden for a measurement with an
environment variable, which is how the bench compares them side by side:

- ``ORTFT_ORT_INTRA_OP_THREADS``: intra-op threads (0: ORT's own choice, the physical cores).
- ``ORTFT_ORT_SPINNING``: 1/0, whether idle intra-op threads spin-wait for work.
- ``ORTFT_ORT_OPT_LEVEL``: disable | basic | extended | all, ORT's graph optimization level.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ortft.backends.report import BackendReport
from ortft.core.errors import BackendError, first_line

if TYPE_CHECKING:
    from torch import nn

log = logging.getLogger("ortft")

_EXPORTS = {"count": 0}

# What ortft sets on ORTModule's sessions unless an ORTFT_ORT_* variable says otherwise.
# None keeps ORTModule's own setting. Spinning off: ORT's idle intra-op threads otherwise
# spin-wait through the optimizer step and the PyTorch kernels, which then run on the remaining
# cores (measured on 2 cores: AdamW's step took 44 ms instead of 21 ms).
SESSION_DEFAULTS: dict[str, str | None] = {
    "ORTFT_ORT_INTRA_OP_THREADS": None,
    "ORTFT_ORT_SPINNING": "0",
    "ORTFT_ORT_OPT_LEVEL": None,
}


# why backend.unpad=auto leaves the ort route padded: the in-graph gather is checked on BERT
# and DistilBERT (tests/test_ort_unpad.py), not yet on every family and task ORT trains
UNPAD_AUTO = "auto: off on the ort backend; backend.unpad=true turns it on (docs/backends.md)"


def session_settings() -> dict[str, str]:
    """The session settings in force: defaults overridden by the environment."""
    out = {}
    for key, default in SESSION_DEFAULTS.items():
        value = os.environ.get(key, default)
        if value is not None:
            out[key] = value
    return out


def apply_session_settings(session_options: Any) -> None:
    """``session_settings()`` applied to one ``onnxruntime.SessionOptions``: ORTModule's
    sessions (below) and the on-device engine's (no PyTorch there, but its optimizer runs in a
    second session while the training session's idle threads would spin)."""
    from onnxruntime import GraphOptimizationLevel

    levels = {
        "disable": GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": GraphOptimizationLevel.ORT_ENABLE_ALL,
    }
    settings = session_settings()
    if "ORTFT_ORT_INTRA_OP_THREADS" in settings:
        session_options.intra_op_num_threads = int(settings["ORTFT_ORT_INTRA_OP_THREADS"])
    if "ORTFT_ORT_SPINNING" in settings:
        session_options.add_session_config_entry(
            "session.intra_op.allow_spinning", settings["ORTFT_ORT_SPINNING"]
        )
    if "ORTFT_ORT_OPT_LEVEL" in settings:
        session_options.graph_optimization_level = levels[settings["ORTFT_ORT_OPT_LEVEL"]]


def _install_session_tweaks() -> None:
    """Apply ``session_settings()`` to every session ORTModule creates (once per process)."""
    from onnxruntime.training.ortmodule import _graph_execution_manager as gem

    cls = gem.GraphExecutionManager
    if getattr(cls._get_session_config, "_ortft_tweaked", False):
        return
    original = cls._get_session_config

    def tweaked(self: Any) -> Any:
        session_options, providers, provider_options = original(self)
        apply_session_settings(session_options)
        return session_options, providers, provider_options

    tweaked._ortft_tweaked = True  # type: ignore[attr-defined]
    cls._get_session_config = tweaked


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


def _install_batchnorm_restore() -> None:
    """ORTModule's export traces the module in training mode, a real forward: every BatchNorm's
    running mean and variance take one more update (of the first batch) than PyTorch gives
    them, and num_batches_tracked counts it (a tiny ResNet's running_var off by 0.2 after 3
    steps). Put the buffers back as they were before the export (once per process)."""
    from onnxruntime.training.ortmodule import _graph_transition_manager as gtm
    from torch import nn

    cls = gtm.GraphTransitionManager
    original = cls._export_model
    if getattr(original, "_ortft_bn_restored", False):
        return

    def restored(*args: Any, **kwargs: Any) -> Any:
        module = kwargs.get("flattened_module")
        saved = []
        for m in module.modules() if module is not None else ():
            if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats:
                saved += [
                    (b, b.detach().clone()) for b in m.buffers(recurse=False) if b is not None
                ]
        try:
            return original(*args, **kwargs)
        finally:
            for buffer, value in saved:  # in place: ORT's graph reads these very tensors
                buffer.data.copy_(value)

    restored._ortft_bn_restored = True  # type: ignore[attr-defined]
    restored._ortft_counted = getattr(original, "_ortft_counted", False)  # type: ignore[attr-defined]
    cls._export_model = staticmethod(restored)


def _install_label_hook_fix() -> None:
    """ORT 1.19.2 bug: with the compute optimizer off, ``_add_check_label_sparsity_hook`` returns
    None and the export then iterates over it (``TypeError: 'NoneType' object is not iterable``),
    so ``backend.compute_optimizer: false`` could never train. Return no hooks instead."""
    from onnxruntime.training.ortmodule import _graph_transition_manager as gtm

    cls = gtm.GraphTransitionManager
    original = cls._add_check_label_sparsity_hook
    if getattr(original, "_ortft_fixed", False):
        return

    def fixed(*args: Any, **kwargs: Any) -> Any:
        handles = original(*args, **kwargs)
        return [] if handles is None else handles

    fixed._ortft_fixed = True  # type: ignore[attr-defined]
    cls._add_check_label_sparsity_hook = staticmethod(fixed)


def _show_ortmodule_log() -> None:
    """ORTModule's own log on stderr, filtered by the level ORTModule is given
    (``backend.log_level``). Importing ORTModule runs a ``logging.basicConfig`` whose root
    handler writes to the ``sys.stderr`` of that moment, the StringIO the import is quieted
    with: through the root, the log would reach nobody whatever the level."""
    logger = logging.getLogger("orttraining")  # a process's rank-N logger is its child
    handler = next((h for h in logger.handlers if h.name == "ortft"), None)
    if not isinstance(handler, logging.StreamHandler):
        handler = logging.StreamHandler()
        handler.set_name("ortft")
        logger.addHandler(handler)
    handler.setStream(sys.stderr)  # this wrap's stderr (a test may have swapped it)
    logger.propagate = False


def export_count() -> int:
    return _EXPORTS["count"]


class OrtBackend:
    name = "ort"

    def __init__(self, options: Any):
        self.options = options
        self._report = BackendReport(requested="ort", used="ort")
        self._start_exports = 0
        self._checked = False
        self.unpadder: Any = None  # torch.unpad.Unpadder traced into the graph, where on
        self.unpad_reason: str | None = None

    def attn_implementation(self, device: Any, dtype: str) -> str:
        # ORTModule cannot build gradients for sdpa attention (measured, torch 2.6 / ORT 1.19)
        return "eager"

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
            with (
                contextlib.redirect_stdout(io.StringIO()),
                contextlib.redirect_stderr(io.StringIO()),
            ):
                from onnxruntime.training.ortmodule import DebugOptions, LogLevel, ORTModule
        except Exception as err:  # noqa: BLE001 - an import failure is the most common setup bug
            raise BackendError(
                f"cannot import ORTModule ({type(err).__name__}: {err}); run `ortft doctor`"
            ) from None
        _show_ortmodule_log()
        _install_export_counter()
        _install_batchnorm_restore()
        _install_session_tweaks()
        _install_label_hook_fix()
        import torch

        from ortft.backends.ortmodule import allocator, patches

        # ORTModule imports the allocator whenever CUDA is available, wherever the model is
        cuda = torch.cuda.is_available()
        self._report.notes.extend(allocator.configure(self.options.gpu_allocator, cuda))
        # architectures ORTModule cannot otherwise train (DeBERTa, ModernBERT, MoE): patches.py
        self._report.notes.extend(patches.apply(module))
        self._route_kernels(module)
        self._unpad(module)
        self._report.notes.extend(f"{k}={v}" for k, v in sorted(session_settings().items()))
        self._report.notes.extend(
            f"{k}={os.environ[k]}" for k in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY") if k in os.environ
        )
        level = self.options.memory_optimization_level
        if (
            level
        ):  # ORTModule's memory optimizer applies a recompute plan (ORTMODULE_MEMORY_OPT_LEVEL)
            self._report.notes.append(f"memory_optimization_level={level}")
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

    def _route_kernels(self, module: nn.Module) -> None:
        """backend.pytorch_kernels: ops that run as PyTorch kernels inside the ORT graph."""
        from ortft.backends.ortmodule import kernels as ort_kernels
        from ortft.backends.torch import fusions

        param = next(module.parameters(), None)
        device = param.device.type if param is not None else "cpu"
        kernels = ort_kernels.resolve(self.options.pytorch_kernels, device)
        ort_kernels.install(kernels, module)
        if "gelu" in kernels:
            swapped = fusions.fuse_tanh_gelu(module)
            if swapped:
                self._report.notes.append(f"NewGELUActivation -> gelu(tanh) x{swapped}")

    def _unpad(self, module: nn.Module) -> None:
        """backend.unpad: the encoder's per-position layers on the real tokens, as ops of the
        exported graph (``unpad.arm_in_graph``); ``unpad.plan`` says where it applies."""
        from ortft.backends.torch import unpad

        model, task = getattr(module, "model", None), getattr(module, "task", None)
        if model is None or task is None:  # not a TaskModule: nothing to plan
            return
        if self.options.unpad == "auto":
            self.unpad_reason = UNPAD_AUTO
            return
        device = next(module.parameters()).device.type
        on, self.unpad_reason = unpad.plan(model, task, self.options.unpad, False, device)
        if on:
            self.unpadder = unpad.install(unpad.encoder_of(model), in_graph=True)
            self._report.notes.append(f"unpad (in the ORT graph): {self.unpad_reason}")

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

    def before_forward(self, seed: int, micro_step: int) -> None:
        """Dropout masks of ORT's graph: a function of the seed and the micro-step (ort_rng),
        and so are those of dropout routed to PyTorch's kernel (backend.pytorch_kernels)."""
        from ortft.backends.ortmodule import kernels as ort_kernels
        from ortft.backends.ortmodule import rng as ort_rng

        ort_rng.reseed(seed, micro_step)
        ort_kernels.reseed(seed, micro_step)

    def after_step(self, wrapped: nn.Module) -> None:
        if self._checked and not self._report.fallback:
            return
        self._checked = True
        torch_module: Any = wrapped._torch_module
        if type(torch_module).__name__ == "TorchModulePytorch":
            self._fell_back("ORTModule initialisation failed")
            return
        manager = torch_module._execution_manager(wrapped.training)
        pending = manager._fallback_manager._exception
        if pending is not None:
            self._fell_back(f"{type(pending).__name__}: {first_line(pending)}")
        elif export_count() == self._start_exports:
            # Nothing was exported, yet the step ran: ORT was not in the loop.
            self._fell_back("ORTModule ran no exported graph")
        else:  # what of the training graph runs as PyTorch kernels (backend.pytorch_kernels)
            from ortft.backends.ortmodule import kernels as ort_kernels

            info = manager._graph_transition_manager._exported_model_info
            if info is not None and info.exported_model is not None:
                self._report.pytorch_kernels = ort_kernels.routed(info.exported_model)

    def report(self) -> BackendReport:
        self._report.ort_exports = export_count() - self._start_exports
        state = self.unpadder
        # the graph gathers in every training step; calls counts the patched modules' traces
        self._report.extra["unpad"] = {
            "on": state is not None,
            "why": self.unpad_reason,
            "traced_gathers": state.calls if state is not None else 0,
        }
        return self._report
