"""The package extras (pyproject.toml's optional dependencies) and the modules each makes
importable: a missing module becomes one line naming the extra that installs it.

The base install has no ONNX Runtime, since ``onnxruntime`` and ``onnxruntime-training`` install
the same ``onnxruntime/`` folder and an extra can only add packages: ``ortft[runtime]`` adds
the inference build (export, parity, ONNX eval and predict), ``ortft[ort]`` the training build
(which serves inference too). Torch-free: the CLI reads it to word an error.
"""

from __future__ import annotations

# extra -> the top-level modules it promises (tests/test_profiles.py installs each and imports them)
EXTRAS: dict[str, tuple[str, ...]] = {
    "runtime": ("onnxruntime", "onnxscript"),
    "ort": ("onnxruntime", "onnxruntime.training", "torch_ort"),
    "trackers": ("tensorboard", "wandb", "mlflow"),
    "diffusion": ("diffusers",),
    "deepspeed": ("deepspeed",),
    "optuna": ("optuna",),
    "peft": ("peft",),
}


def install_hint(module: str | None) -> str | None:
    """How to install a missing top-level ``module``; None when no extra provides it."""
    if not module:
        return None
    if module.startswith(("onnxruntime.training", "torch_ort")):
        return "the ort profile: make setup, or pip install 'ortft[ort]' (Python 3.11/3.12)"
    top = module.split(".")[0]
    if top == "onnxruntime":  # the one module two extras provide: either serves inference
        return "pip install 'ortft[runtime]' (or 'ortft[ort]' for ONNX Runtime training)"
    for extra, modules in EXTRAS.items():
        if top in modules:
            return f"pip install 'ortft[{extra}]'"
    return None


def missing_module_line(error: ModuleNotFoundError) -> str | None:
    """The one-line error for a missing optional package; None for any other module (a bug)."""
    hint = install_hint(error.name)
    if hint is None:
        return None
    return f"this needs {error.name}, which is not installed: {hint}"
