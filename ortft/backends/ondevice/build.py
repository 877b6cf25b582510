"""The PyTorch half of ``backend.name: ort-ondevice``: build the model once and write its
on-device training artifacts (``artifacts``). The on-device engine (``engine``) then trains them
without PyTorch.

``<run>/ondevice/artifacts/`` holds ``training_model.onnx``, ``eval_model.onnx``,
``optimizer_model.onnx`` (AdamW with the recipe's betas, eps, weight decay and gradient
clipping baked in), ``checkpoint`` (the initial weights), the tokenizer, ``config.json`` and
``artifacts.json`` (what was built, and from what). It is written into a temporary folder and
swapped into place (``fsutil.atomic_dir``), so a crash never leaves half of it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ortft.backends.ondevice import artifacts
from ortft.backends.torch import models
from ortft.core import fsutil
from ortft.core.constants import IGNORE_INDEX
from ortft.data import checks
from ortft.recipe.io import LoadedRecipe
from ortft.tasks import protocols

log = logging.getLogger("ortft")

FORMAT_VERSION = 2  # 2: the graphs take loss_scale (token-weighted gradient accumulation)
MARKER = "artifacts.json"


def _example(
    task: Any,
    rows: list[dict[str, Any]],
    tokenizer: Any,
    loaded: LoadedRecipe,
    label2id: dict[str, int] | None,
) -> dict[str, np.ndarray]:
    """Two training rows, the second half padded: the exporter traces one path, and a batch
    without padding would leave the attention mask out of the graph for good."""
    enc = task.encode(rows[:8], tokenizer, loaded.recipe.data, label2id)
    batch = enc.take(np.arange(2) % len(enc))
    ids, mask = batch["input_ids"].copy(), batch["attention_mask"].copy()
    cut = max(1, ids.shape[1] // 2)
    mask[1, cut:] = 0
    ids[1, cut:] = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    if isinstance(task, protocols.ExportsDecoder):  # a language model: labels are the inputs
        labels = np.where(mask == 1, ids, IGNORE_INDEX).astype(np.int64)
    else:
        labels = batch["labels"].astype(np.int64)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


@contextlib.contextmanager
def _native_stderr_quiet() -> Iterator[None]:
    """Send file descriptor 2 (where ORT's C++ logger writes) to a temporary file; replay its
    last lines if the block fails, so an error still shows its cause."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        except BaseException:
            os.dup2(saved, 2)
            sink.seek(0)
            sys.stderr.write(
                b"\n".join(sink.read().splitlines()[-20:]).decode(errors="replace") + "\n"
            )
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def build(
    loaded: LoadedRecipe,
    task: Any,
    train_rows: list[dict[str, Any]],
    labels: list[str] | None,
    saved_tokenizer: Path | None,
    art_dir: Path,
) -> dict[str, Any]:
    """Write ``art_dir`` (see the module docstring); return artifacts.json's content."""
    r = loaded.recipe
    tokenizer = models.load_tokenizer(loaded, saved_dir=saved_tokenizer)
    if tokenizer is None:  # the recipe's rules: no tokenizer to load means train: is set
        spec: Any = r.model.tokenizer.train
        tokenizer = models.train_tokenizer(checks.texts(task, train_rows, r.data), spec)
        log.info("trained a %s tokenizer: %d tokens", spec.kind, len(tokenizer))
    model: Any = models.build_model(loaded, task.auto_class, tokenizer, labels, attn="eager")
    if r.backend.trainable:
        models.freeze(model, r.backend.trainable)  # validates the patterns with a recipe message
    log.info("%s", models.model_log_line(model, "eager"))
    label2id = {name: i for i, name in enumerate(labels)} if labels else None
    example = _example(task, train_rows, tokenizer, loaded, label2id)
    t, o = r.training, r.optimizer
    with fsutil.atomic_dir(art_dir) as tmp:  # an earlier art_dir stays whole until the swap
        with _native_stderr_quiet():  # the gradient builder logs every graph pass at info level
            report = artifacts.generate_training_artifacts(
                model,
                task.name,
                tmp,
                example,
                trainable=r.backend.trainable,
                optimizer={
                    "betas": tuple(o.betas),
                    "eps": o.eps,
                    "weight_decay": t.weight_decay,
                    "max_grad_norm": t.max_grad_norm,
                },
                loss_scale=True,
            )
        tokenizer.save_pretrained(tmp)
        model.config.architectures = [type(model).__name__]  # what ortft eval / export read
        model.config.save_pretrained(tmp)
        meta = {
            "format_version": FORMAT_VERSION,
            "kind": "ortft-ondevice-artifacts",
            "task": task.name,
            "labels": labels,
            "torch": torch.__version__,
            **report,
        }
        (tmp / MARKER).write_text(json.dumps(meta, indent=2) + "\n")
    log.info(
        "on-device training artifacts: %s (%d of %d parameter tensors train)",
        art_dir,
        report["trainable_parameters"],
        report["trainable_parameters"] + report["frozen_parameters"],
    )
    return meta
