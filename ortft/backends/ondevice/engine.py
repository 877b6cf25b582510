"""``ort-ondevice``: ONNX Runtime's on-device training API (``onnxruntime.training.api``), no PyTorch.

The training artifacts (training / eval / optimizer graphs and a checkpoint) are built once with
PyTorch by ``build``, or given as ``model.name_or_path`` (a folder made by ``ortft export
--training-artifacts``). Then ``Module`` / ``Optimizer`` / ``CheckpointState`` train; the run's
lifecycle is ``ortft.run``'s, the same as every backend's.

This module imports no PyTorch: with artifacts that already exist (a resumed run, or an exported
folder) a run never loads it (tests/test_ondevice.py). What differs from the PyTorch engine:
the AdamW graph applies weight decay to every trainable tensor (torch's loop spares biases and
LayerNorm weights), and accumulated gradients are summed, not averaged (Adam is invariant to
that scale, up to eps).
"""

from __future__ import annotations

import json
import logging
import os
import random
from pathlib import Path
from typing import Any

import numpy as np

from ortft.backends import Started, StepResult
from ortft.backends.ondevice.schedules import lr_at
from ortft.backends.ortmodule import rng as ort_rng
from ortft.backends.report import BackendReport
from ortft.checkpoint import store as checkpoint
from ortft.checkpoint.store import TrainState
from ortft.core.errors import InputError, RunError
from ortft.core.reports import ExportReport, ParityReport
from ortft.recipe.io import LoadedRecipe
from ortft.tasks import Encoded, Task, traits

log = logging.getLogger("ortft")

ARTIFACTS = ("training_model.onnx", "eval_model.onnx", "optimizer_model.onnx", "checkpoint")
CKPT_KIND = "ortft-ondevice-checkpoint"
INPUTS = ("input_ids", "attention_mask", "labels")


# --------------------------------------------------------------------------- artifacts


def artifacts_dir(loaded: LoadedRecipe) -> Path | None:
    """model.name_or_path when it names on-device training artifacts (the edge workflow)."""
    value = loaded.recipe.model.name_or_path
    if not value:
        return None
    path = loaded.resolve_path(value)
    return path if (path / "training_model.onnx").exists() else None


def _meta_dir(art_dir: Path) -> Path:
    """Where the tokenizer and config.json are: with the artifacts, or (``ortft export
    --training-artifacts``'s OUT/training/) in the folder above."""
    for d in (art_dir, art_dir.parent):
        if (d / "config.json").exists():
            return d
    raise InputError(
        f"{art_dir}: no config.json here or in {art_dir.parent} (the tokenizer and "
        "config must come with the artifacts, as `ortft export --training-artifacts` "
        "writes them)"
    )


def _load_tokenizer_and_config(meta: Path) -> tuple[Any, Any]:
    from transformers import AutoConfig, AutoTokenizer

    try:
        tokenizer, config = AutoTokenizer.from_pretrained(meta), AutoConfig.from_pretrained(meta)
    except (OSError, ValueError, KeyError) as err:
        raise InputError(f"{meta}: cannot load the tokenizer/config ({err})") from None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer, config


def _check_labels(config: Any, labels: list[str] | None, art_dir: Path) -> None:
    if labels is None:
        return
    have = [str(config.id2label[i]) for i in range(len(config.id2label))]
    if have != labels:
        raise InputError(
            f"{art_dir}: the artifacts were built for labels {have}, the data has "
            f"{labels} (set data.label_names to match, or rebuild the artifacts)"
        )


def _check_lookup_gradients(art_dir: Path) -> None:
    """Refuse artifacts whose position-embedding gradient writes out of bounds: built by ortft
    before 2026-12 (or by other tools) from transformers' broadcast position ids (see
    ortft/export/lookups.py). They corrupt ORT's heap as soon as batch shapes vary."""
    import onnx

    from ortft.export.lookups import broadcast_lookups

    graph = onnx.load(str(art_dir / "training_model.onnx"), load_external_data=False).graph
    bad = broadcast_lookups(graph, set(INPUTS), op="GatherGrad")
    if bad:
        raise InputError(
            f"{art_dir}/training_model.onnx: the gradient of {', '.join(bad)} is built from "
            "ids broadcast over the batch, which onnxruntime-training 1.19 computes with "
            "out-of-bounds writes; rebuild the artifacts (delete the folder of a run's own "
            "ones, or run `ortft export --training-artifacts` again)"
        )


def training_api() -> Any:
    """``onnxruntime.training.api``, without running ``onnxruntime/training/__init__.py``.

    In ORT 1.19 that ``__init__`` imports ``onnxruntime.training.optim``, which imports PyTorch
    (and fails where it is not installed), though the on-device API (``api/``) needs only ORT's
    C++ bindings. When the package is not imported yet, it is registered bare (its path, no
    ``__init__``) so that ``api`` loads alone; when it is (this process built the artifacts with
    PyTorch), the normal import is used.
    """
    import importlib
    import importlib.util
    import sys
    import types

    if "onnxruntime.training" not in sys.modules:
        import onnxruntime  # noqa: F401 - the parent package, which does not import PyTorch

        spec = importlib.util.find_spec("onnxruntime.training")
        if spec is None or not spec.submodule_search_locations:
            raise RunError("backend.name=ort-ondevice needs onnxruntime-training (not installed)")
        bare = types.ModuleType("onnxruntime.training")
        bare.__path__ = list(spec.submodule_search_locations)
        bare.__spec__, bare.__file__ = spec, spec.origin
        sys.modules["onnxruntime.training"] = bare
    return importlib.import_module("onnxruntime.training.api")


def _feeds(batch: dict[str, np.ndarray], scale: float | None = None) -> list[np.ndarray]:
    """The graph's inputs in order; ``scale`` for artifacts whose graphs take ``loss_scale``."""
    feeds = [np.ascontiguousarray(batch[k], dtype=np.int64) for k in INPUTS]
    return feeds if scale is None else [*feeds, np.array(scale, dtype=np.float32)]


def _peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: kilobytes


def create(loaded: LoadedRecipe) -> OnDeviceEngine:
    return OnDeviceEngine(loaded)


class OnDeviceEngine:
    name = "ort-ondevice"

    def __init__(self, loaded: LoadedRecipe):
        self.loaded, self.recipe = loaded, loaded.recipe
        self.exports = 0  # 1 when this run built the artifacts (PyTorch's ONNX export)
        self.scaled = False  # the artifacts' graphs take loss_scale (set in prepare)
        self.art_dir: Path | None = None
        self.device = "cpu"

    def start(self, recipe: Any) -> Started:
        """Device and session options. hardware.threads sizes ORT's intra-op pool and
        training.deterministic asks ORT for deterministic kernels: both applied, never ignored."""
        import onnxruntime as ort

        from ortft.backends.ortmodule.wrapper import apply_session_settings

        hw, t = recipe.hardware, recipe.training
        ort.set_default_logger_severity(3)  # the session warns about every frozen initializer
        gpu = (
            Path("/dev/nvidia0").exists()
            and "CUDAExecutionProvider" in ort.get_available_providers()
        )
        if hw.device == "cuda" and not gpu:
            raise InputError("hardware.device=cuda but no CUDA GPU is visible; use auto or cpu")
        # auto: cuda only with a GPU present (a CUDA build of ORT lists its provider regardless)
        self.device = "cuda" if hw.device == "cuda" or (hw.device == "auto" and gpu) else "cpu"
        reason = (
            "hardware.device"
            if hw.device != "auto"
            else ("auto: a CUDA GPU is visible" if gpu else "auto: no CUDA GPU visible")
        )
        self.options = ort.SessionOptions()
        # ORTModule's session settings (spinning off; ORTFT_ORT_* overrides), then the recipe's
        # threads. Spinning off measured 1.40x faster steps on bert-cls (one process, the two
        # settings alternating, 10 steps each, a loaded 2-core machine; benchmarks/README.md).
        apply_session_settings(self.options)
        threads = (
            hw.threads
            or int(os.environ.get("ORTFT_ORT_INTRA_OP_THREADS", 0))
            or os.cpu_count()
            or 1
        )
        self.options.intra_op_num_threads = threads
        if t.deterministic:
            self.options.use_deterministic_compute = True
        random.seed(t.seed)
        np.random.seed(t.seed)
        return Started(self.device, threads, reason)

    def is_main(self) -> bool:
        return True  # one process

    def any_rank(self, *flags: bool) -> tuple[bool, ...]:
        return flags

    def tokenizer(self, loaded, run_dir: Path, task: Any, train_rows: list, labels: Any) -> Any:
        """The artifacts' tokenizer; the artifacts are built first (once) unless given."""
        r = loaded.recipe
        given = artifacts_dir(loaded)
        art_dir = given or run_dir / "ondevice" / "artifacts"
        if given is not None and r.backend.trainable:
            raise InputError(
                "backend.trainable: the artifacts in model.name_or_path fix what trains; "
                "remove backend.trainable (or rebuild them with --trainable)"
            )
        if given is None and not (art_dir / "artifacts.json").exists():
            from ortft.backends.ondevice import (
                build as ondevice_build,  # the one place PyTorch is used
            )

            tok_dir = run_dir / "tokenizer"
            saved = tok_dir if tok_dir.exists() else None
            ondevice_build.build(loaded, task, train_rows, labels, saved, art_dir)
            self.exports = 1
        missing = [f for f in ARTIFACTS if not (art_dir / f).exists()]
        if missing:
            raise InputError(
                f"{art_dir}: not on-device training artifacts (missing {', '.join(missing)})"
            )
        _check_lookup_gradients(art_dir)
        self.art_dir = art_dir
        tokenizer, self.config = _load_tokenizer_and_config(_meta_dir(art_dir))
        _check_labels(self.config, labels, art_dir)
        return tokenizer

    def prepare(
        self,
        loaded: LoadedRecipe,
        task: Task,
        tokenizer: Any,
        labels: list[str] | None,
        train: Encoded,
        run_dir: Path,
        resume_from: Path | None,
        total_steps: int,
    ) -> TrainState:
        api, art_dir = training_api(), self.art_dir
        assert art_dir is not None
        self.task, self.total_steps = task, total_steps
        state = TrainState()
        if resume_from is not None:
            state = TrainState(**json.loads((resume_from / "state.json").read_text()))
        self.step, self.micro_step = state.step, state.micro_step
        try:
            self.ckpt = api.CheckpointState.load_checkpoint(
                str((resume_from or art_dir) / "checkpoint")
            )
            self.module = api.Module(
                str(art_dir / "training_model.onnx"),
                self.ckpt,
                str(art_dir / "eval_model.onnx"),
                device=self.device,
                session_options=self.options,
            )
            self.optimizer = api.Optimizer(str(art_dir / "optimizer_model.onnx"), self.module)
            # ortft's own artifacts take loss_scale; `ortft export --training-artifacts` ones
            # (made for other trainers) do not: their micro-batches weigh equally (see train_step)
            self.scaled = "loss_scale" in self.module.input_names()
        except Exception as err:  # noqa: BLE001 - ORT raises RuntimeError / its own Fail types
            first = (str(err).strip().splitlines() or [type(err).__name__])[-1]
            raise RunError(
                f"onnxruntime.training could not open {art_dir} on {self.device}: {first[:300]}"
            ) from err
        if not self.scaled and self.recipe.training.gradient_accumulation_steps > 1:
            log.warning(
                "%s: these artifacts take no loss_scale input, so the %d micro-batches of a step "
                "weigh equally (not by their real tokens); rebuild them with ortft train "
                "(backend.name=ort-ondevice) for token-weighted accumulation",
                art_dir,
                self.recipe.training.gradient_accumulation_steps,
            )
        n_train, n_all = self.parameter_counts()[::-1]
        log.info(
            "backend: ort-ondevice (onnxruntime.training.api on %s); %s; %d of %d parameters train",
            self.device,
            art_dir,
            n_train,
            n_all,
        )
        self.module.train()
        return state

    def train_step(self, micro_batches: list[dict[str, np.ndarray]]) -> StepResult:
        t = self.recipe.training
        warmup = t.warmup_steps or int(t.warmup_ratio * self.total_steps)
        lr = lr_at(
            self.step,
            schedule=t.scheduler,
            lr=t.lr,
            warmup_steps=warmup,
            total_steps=self.total_steps,
        )
        self.optimizer.set_learning_rate(lr)
        # Gradients add up in the module until lazy_reset_grad. Each micro-batch's loss (a mean
        # over its counted tokens) is scaled by its share of the step's tokens: the sum is the
        # mean over all of them, as on the PyTorch engine; equal shares without loss_scale.
        counts = [self.task.counted(b) for b in micro_batches]
        total = max(sum(counts), 1)
        loss_sum = 0.0
        for batch, count in zip(micro_batches, counts, strict=True):
            ort_rng.reseed(t.seed, self.micro_step)  # dropout: a function of where the run is
            self.micro_step += 1
            scale = count / total if self.scaled else None
            loss = float(self.module(*_feeds(batch, scale)))  # training graph: the loss alone
            loss_sum += loss if self.scaled else loss / len(micro_batches)
        self.optimizer.step()
        self.module.lazy_reset_grad()
        self.step += 1
        return StepResult(loss=loss_sum, lr=lr)

    def eval_mode(self, on: bool) -> None:
        self.module.eval() if on else self.module.train()

    def eval_batch(self, batch: dict[str, np.ndarray]) -> tuple[float, np.ndarray | None]:
        loss, logits = self.module(*_feeds(batch, 1.0 if self.scaled else None))
        valid = int(batch["_valid"])
        out = (
            np.asarray(logits[:valid], dtype=np.float32) if traits.needs_logits(self.task) else None
        )
        return float(loss), out

    def extra_metrics(self, task: Any, tokenizer: Any, encoded: Any) -> dict[str, float]:
        return {}  # the on-device tasks' metrics come from logits alone

    def save(self, run_dir: Path, state: TrainState, recipe_yaml: str, keep_last: int) -> Path:
        """``step-NNNNNN/``: ORT's checkpoint (weights + optimizer state), recipe.yaml,
        state.json and manifest.json (``checkpoint.write_step``)."""

        def fill(tmp: Path) -> None:
            training_api().CheckpointState.save_checkpoint(
                self.ckpt, str(tmp / "checkpoint"), include_optimizer_state=True
            )

        return checkpoint.write_step(run_dir, state, recipe_yaml, CKPT_KIND, keep_last, fill)

    def checkpoint_problem(self, path: Path) -> str | None:
        return checkpoint.kind_problem(path, CKPT_KIND)

    def save_best(self, run_dir: Path, state: TrainState) -> None:
        return None  # checkpoint.final=best is refused for this backend (recipe check)

    def select_final(self, selector: Any, run_dir: Path, state: TrainState) -> None:
        selector.load_final(run_dir, None, state)  # final: last (best is refused)

    def write_final(self, folder: Path) -> None:
        """The inference graph (inputs input_ids + attention_mask, output logits) and config."""
        self.module.eval()
        self.module.export_model_for_inferencing(str(folder / "model.onnx"), ["logits"])
        self.module.train()
        self.config.save_pretrained(folder)

    def export(self, run_dir: Path, final_dir: Path, samples: Any) -> ExportReport:
        """final/model.onnx checked against the eval graph, which holds the same trained weights
        but runs in onnxruntime.training: a separate build of the same graph, not a copy."""
        from onnxruntime import InferenceSession

        from ortft.data import batches

        probe = next(batches.eval_batches(samples, self.recipe.training.batch_size))
        self.module.eval()
        _, want = self.module(*_feeds(probe, 1.0 if self.scaled else None))
        self.module.train()
        model = final_dir / "model.onnx"
        sess = InferenceSession(str(model), providers=["CPUExecutionProvider"])
        got = sess.run(["logits"], {k: probe[k].astype(np.int64) for k in INPUTS[:2]})[0]
        diff, tolerance = float(np.max(np.abs(got - want))), self.recipe.export.tolerance
        parity: ParityReport = {
            "against": "the eval graph with the trained weights (onnxruntime.training)",
            "samples": int(len(probe["input_ids"])),
            "max_abs_diff": diff,
            "prediction_agreement": float(np.mean(got.argmax(-1) == want.argmax(-1))),
            "tolerance": tolerance,
            "passed": diff <= tolerance,
        }
        return {
            "dir": str(final_dir),
            "model": str(model),
            "parity": parity,
            "passed": parity["passed"],
            "note": "final/model.onnx is the trained ONNX model; `ortft export RUN` "
            "adds optimized / fp16 / int8 variants",
        }

    def parameter_counts(self) -> tuple[int, int]:
        return self.module.get_parameters_size(False), self.module.get_parameters_size(True)

    def precision(self) -> None:
        return None  # fp32 only (recipe check)

    def report(self) -> BackendReport:
        note = "onnxruntime.training.api; " + (
            "PyTorch only to build the artifacts" if self.exports else "no PyTorch"
        )
        from ortft.backends.ortmodule.wrapper import session_settings

        settings = [f"{k}={v}" for k, v in sorted(session_settings().items())]
        rep = BackendReport(
            requested=self.name, used=self.name, ort_exports=self.exports, notes=[note, *settings]
        )
        rep.extra.update(peak_rss_mb=round(_peak_rss_mb(), 1), artifacts=str(self.art_dir))
        return rep

    def close(self, ok: bool) -> None:
        return None
