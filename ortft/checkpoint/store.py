"""Checkpoints that describe themselves, written atomically.

``step-000100/`` holds ``model.safetensors``, ``optimizer.pt``, ``scheduler.pt``, ``rng.pt``,
``recipe.yaml``, ``state.json`` (step, position in the data, metrics) and ``manifest.json``
(format version, every file's size and sha256). A DeepSpeed run's checkpoint holds, instead of
``optimizer.pt`` and ``scheduler.pt``, ``deepspeed/``: DeepSpeed's own checkpoint, one ZeRO
partition of the optimizer state per process (``backends/deepspeed.py``). It is written into a temporary folder,
fsynced, then swapped into place (``fsutil.atomic_dir``): a crash leaves either the whole
checkpoint or none, and the previous checkpoints are pruned only after the new one is complete.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ortft.core import fsutil
from ortft.core.errors import InputError, RunError

if TYPE_CHECKING:
    import torch

log = logging.getLogger("ortft")

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
ADAPTER_WEIGHTS = "adapter.safetensors"  # a LoRA run's checkpoints: trainable weights only
PREFIX = "step-"


@dataclass
class TrainState:
    """Where the loop is: enough to continue exactly where it stopped."""

    step: int = 0  # optimizer steps done
    micro_step: int = 0  # micro-batches consumed (data position)
    epoch: int = 0
    samples: int = 0
    tokens: int = 0  # real (non-padding) tokens trained on
    padded_tokens: int = 0  # token slots trained on, padding included (data.padding)
    train_time_s: float = 0.0
    last_train_loss: float | None = None
    eval_metrics: dict[str, float] = field(default_factory=dict)
    # best-model selection and early stopping (selection.py), carried across a resume
    best_step: int | None = None  # the eval whose weights are in <run>/best/
    best_value: float | None = None
    stop_reference: float | None = None  # early stopping: what an eval must beat by min_delta
    evals_without_improvement: int = 0
    # the tracker runs a resume continues (logging.trackers): {"mlflow": run id, "wandb": run id}
    trackers: dict[str, str] = field(default_factory=dict)


def checkpoint_name(step: int) -> str:
    return f"{PREFIX}{step:06d}"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def rng_state() -> dict[str, Any]:
    """Every RNG the run uses, as plain tensors/ints so it loads with ``weights_only=True``."""
    import torch  # lazily: the ort-ondevice loop uses this module's helpers without PyTorch

    py_version, py_state, py_gauss = random.getstate()
    np_state: Any = np.random.get_state()  # numpy's typing does not know the legacy tuple
    _, np_key, np_pos, np_has_gauss, np_gauss = np_state
    return {
        "python": [py_version, torch.tensor(py_state, dtype=torch.int64), py_gauss],
        "numpy": [torch.from_numpy(np_key.astype(np.int64)), np_pos, np_has_gauss, np_gauss],
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def set_rng_state(state: dict[str, Any]) -> None:
    import torch

    py_version, py_state, py_gauss = state["python"]
    random.setstate((py_version, tuple(int(x) for x in py_state.tolist()), py_gauss))
    np_key, np_pos, np_has_gauss, np_gauss = state["numpy"]
    np.random.set_state(
        ("MT19937", np_key.numpy().astype(np.uint32), np_pos, np_has_gauss, np_gauss)
    )
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def write_step(
    run_dir: Path,
    state: TrainState,
    recipe_yaml: str,
    kind: str,
    keep_last: int,
    fill: Callable[[Path], None],
) -> Path:
    """Every engine's ``step-NNNNNN/``: ``fill(tmp)`` writes the engine's own files (weights,
    optimizer, RNG; ORT's checkpoint for ort-ondevice), then recipe.yaml, state.json and the
    manifest go in, the folder is swapped in whole and older ones are pruned to ``keep_last``."""
    final = run_dir / checkpoint_name(state.step)
    try:
        # a step saved twice (e.g. a signal right after a periodic save) swaps the new copy in
        # whole; the earlier copy is deleted only after the swap
        with fsutil.atomic_dir(final) as tmp:
            fill(tmp)
            (tmp / "recipe.yaml").write_text(recipe_yaml)
            (tmp / "state.json").write_text(json.dumps(asdict(state), indent=2))
            write_manifest(tmp, state.step, kind)
    except OSError as err:  # disk full, read-only, quota: the earlier checkpoints are untouched
        earlier = [p for p in list_checkpoints(run_dir) if p != final]
        kept = f"; the last good checkpoint {earlier[-1]} is intact" if earlier else ""
        raise RunError(f"could not write checkpoint {final}: {err.strerror or err}{kept}") from err
    prune(run_dir, keep_last)
    return final


def save(
    run_dir: Path,
    state: TrainState,
    model: torch.nn.Module,
    optimizer: Any,
    scheduler: Any,
    recipe_yaml: str,
    keep_last: int,
    scaler: dict[str, Any] | None = None,
    kind: str = "ortft-checkpoint",
    folders: dict[str, Path] | None = None,
    task_state: dict[str, Any] | None = None,
) -> Path:
    """A PyTorch engine's ``step-NNNNNN/`` (``write_step``). ``scaler``: the fp16 GradScaler's
    state (``backends.amp.scaler_state``), kept as scaler.pt when set. ``task_state``: what the
    task keeps besides the model (text-to-image's EMA weights), kept as task_state.pt when set.
    ``folders``: complete
    folders (name -> path) moved into the checkpoint before its manifest is written, as
    DeepSpeed's partitions, whose engine holds the optimizer and scheduler (both None)."""
    import torch

    def fill(tmp: Path) -> None:
        if hasattr(model, "peft_config"):  # LoRA: only the trained (adapter + head) weights
            save_trainable(model, tmp / ADAPTER_WEIGHTS)
        else:
            save_weights(model, tmp / "model.safetensors")
        if optimizer is not None:
            torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
            torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
        for name, folder in (folders or {}).items():
            os.replace(folder, tmp / name)
        torch.save(rng_state(), tmp / "rng.pt")
        if scaler:  # fp16: a resumed run starts at the loss scale this one reached
            torch.save(scaler, tmp / "scaler.pt")
        if task_state:
            torch.save(task_state, tmp / "task_state.pt")

    return write_step(run_dir, state, recipe_yaml, kind, keep_last, fill)


def save_weights(model: torch.nn.Module, path: Path) -> None:
    """The model's tensors in safetensors, each tied weight once (as ``save_model`` writes them).
    A tensor that is a view into a larger buffer is copied out first: DeepSpeed's ZeRO 1/2 turns
    the parameters into views of one flat buffer, which ``save_model`` refuses to write."""
    from safetensors.torch import save_file

    tensors: dict[str, Any] = {}
    seen = set()
    for name, t in model.state_dict().items():
        key = (t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype)
        if key in seen:  # tied (the same tensor under two names): load_model restores it
            continue
        seen.add(key)
        whole = t.untyped_storage().nbytes() == t.numel() * t.element_size()
        tensors[name] = t.detach() if whole and t.is_contiguous() else t.detach().clone()
    save_file(tensors, str(path), metadata={"format": "pt"})


def save_trainable(model: torch.nn.Module, path: Path) -> None:
    from safetensors.torch import save_file

    save_file(
        {n: p.detach().contiguous().cpu() for n, p in model.named_parameters() if p.requires_grad},
        str(path),
    )


def load_trainable(model: torch.nn.Module, path: Path) -> None:
    """Load the trainable weights of a LoRA checkpoint; every one of them must be there."""
    import torch
    from safetensors.torch import load_file

    if not hasattr(model, "peft_config"):
        raise ValueError("Unexpected adapter weights: this recipe has no adapter section")
    if not path.exists():
        raise ValueError(
            "Missing adapter weights: the checkpoint holds a full model, the recipe an adapter"
        )
    weights = load_file(str(path))
    want = {n for n, p in model.named_parameters() if p.requires_grad}
    if set(weights) != want:
        raise ValueError(f"Missing/Unexpected adapter weights: {sorted(want ^ set(weights))[:3]}")
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in weights.items():
            if params[name].shape != value.shape:
                raise ValueError(
                    f"size mismatch for {name}: {tuple(value.shape)} vs {tuple(params[name].shape)}"
                )
            params[name].copy_(value)


def write_manifest(folder: Path, step: int, kind: str) -> None:
    """fsync every file of a checkpoint being written (sub-folders included) and record its
    size and sha256, under its path relative to ``folder``."""
    files = {}
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
        files[f.relative_to(folder).as_posix()] = {"bytes": f.stat().st_size, "sha256": _sha256(f)}
    manifest = {"format_version": FORMAT_VERSION, "kind": kind, "step": step, "files": files}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2))
    with open(folder / MANIFEST, "rb") as fh:
        os.fsync(fh.fileno())


def list_checkpoints(run_dir: Path) -> list[Path]:
    if not run_dir.is_dir():
        return []
    found = [
        p
        for p in run_dir.iterdir()
        if p.is_dir() and p.name.startswith(PREFIX) and p.name[len(PREFIX) :].isdigit()
    ]
    return sorted(found, key=lambda p: int(p.name[len(PREFIX) :]))


def prune(run_dir: Path, keep_last: int) -> None:
    for old in list_checkpoints(run_dir)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)


def verify(path: Path, deep: bool = False) -> str | None:
    """None if the checkpoint is complete (and, when ``deep``, its checksums match); else why not."""
    mpath = path / MANIFEST
    if not mpath.exists():
        return "no manifest.json (incomplete or not an ortft checkpoint)"
    try:
        manifest = json.loads(mpath.read_text())
    except (OSError, json.JSONDecodeError):
        return "manifest.json is unreadable"
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        return f"format_version {version} is not supported (this ortft reads {FORMAT_VERSION})"
    for name, meta in manifest.get("files", {}).items():
        f = path / name
        if not f.exists() or f.stat().st_size != meta["bytes"]:
            return f"{name} is missing or truncated"
        if deep and _sha256(f) != meta["sha256"]:
            return f"{name} does not match its checksum"
    return None


def latest_good(run_dir: Path) -> Path | None:
    """The newest complete checkpoint; damaged ones are skipped with a warning."""
    for path in reversed(list_checkpoints(run_dir)):
        problem = verify(path)
        if problem is None:
            return path
        log.warning("skipping checkpoint %s: %s", path, problem)
    return None


@dataclass
class Loaded:
    path: Path
    state: TrainState
    optimizer: dict[str, Any] | None  # None in a DeepSpeed checkpoint (its engine loads them)
    scheduler: dict[str, Any] | None
    rng: dict[str, Any]
    scaler: dict[str, Any] | None = None  # fp16 runs' GradScaler state
    task_state: dict[str, Any] | None = None  # the task's own (text-to-image: EMA weights)


def load(path: Path, model: torch.nn.Module) -> Loaded:
    """Load weights into ``model`` and return the rest of the checkpoint."""
    import torch
    from safetensors.torch import load_model

    problem = verify(path, deep=True)
    if problem:
        raise InputError(f"{path}: not a usable checkpoint: {problem}")
    try:
        if (path / ADAPTER_WEIGHTS).exists() or hasattr(model, "peft_config"):
            load_trainable(model, path / ADAPTER_WEIGHTS)
        else:
            load_model(model, str(path / "model.safetensors"))
    except (
        RuntimeError,
        ValueError,
        KeyError,
        FileNotFoundError,
    ) as err:  # another model's (or recipe's) weights
        lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
        detail = next(
            (ln for ln in lines if ln.startswith(("size mismatch", "Missing", "Unexpected"))),
            lines[0] if lines else type(err).__name__,
        )
        raise InputError(
            f"{path}: checkpoint does not fit this recipe's model ({detail[:300]})"
        ) from None
    state = TrainState(**json.loads((path / "state.json").read_text()))
    return Loaded(
        path=path,
        state=state,
        optimizer=_load_if_there(path / "optimizer.pt"),
        scheduler=_load_if_there(path / "scheduler.pt"),
        rng=torch.load(path / "rng.pt", weights_only=True),
        scaler=_load_if_there(path / "scaler.pt"),
        task_state=_load_if_there(path / "task_state.pt"),
    )


def _load_if_there(path: Path) -> Any:
    import torch

    return torch.load(path, weights_only=True) if path.exists() else None


def kind_problem(path: Path, kind: str) -> str | None:
    """Why ``path`` is not a checkpoint of ``kind`` (written by another backend), or None."""
    problem = verify(path) if path.is_dir() else "not a directory"
    if problem:
        return problem
    found = json.loads((path / MANIFEST).read_text()).get("kind", "ortft-checkpoint")
    if found != kind:
        return f"a {found}, not an {kind} (written by another backend)"
    return None
