"""``ortft eval`` of a model that embeds (a sentence-embedding run, its ``embedding`` ONNX export,
a bare encoder folder): retrieval over the eval pairs, on PyTorch or ONNX Runtime.

The figures are training's (``task``): every anchor against every
positive of the split by cosine similarity (accuracy@1, MRR@10, recall@10), so ``ortft eval RUN``
on the run's own eval split repeats its ``summary.json`` metrics. ``loss`` is the in-batch loss
(MultipleNegativesRankingLoss at the run's ``task.scale``) over consecutive batches of the run's
``training.batch_size`` pairs, as training's eval batches them (it depends on the batch size;
``--batch-size`` there for a model without a recipe, and the forward's chunk either way).
"""

from __future__ import annotations

import logging
import time
import types
from pathlib import Path
from typing import Any

import numpy as np

from ortft import tasks
from ortft.core.reports import EvalResult
from ortft.families.embedding import predict as predict_embedding
from ortft.families.embedding import task as sentence_embedding
from ortft.inference import evaluate
from ortft.recipe.task import read_task

log = logging.getLogger("ortft")


def _task(recipe_yaml: Path | None) -> Any:
    """The run's sentence-embedding task (its column names and scale), else the defaults."""
    options = read_task(recipe_yaml) if recipe_yaml is not None else None
    if options is not None and options.name == sentence_embedding.SentenceEmbedding.name:
        return tasks.get(options.name, options)
    return tasks.get(sentence_embedding.SentenceEmbedding.name)


def in_batch_loss(
    anchors: np.ndarray,
    positives: np.ndarray,
    negatives: np.ndarray | None,
    scale: float,
    batch_size: int,
) -> float:
    """Mean cross-entropy of each anchor's scaled cosine similarities to its batch's positives
    (and negatives) against its own positive, over consecutive batches of ``batch_size``."""
    a, p = predict_embedding.unit(anchors), predict_embedding.unit(positives)
    n = predict_embedding.unit(negatives) if negatives is not None else None
    total = 0.0
    for start in range(0, len(a), batch_size):
        end = min(start + batch_size, len(a))
        cands = p[start:end] if n is None else np.concatenate([p[start:end], n[start:end]])
        logits = scale * (a[start:end] @ cands.T)
        top = logits.max(axis=1, keepdims=True)
        logz = np.log(np.exp(logits - top).sum(axis=1)) + top[:, 0]
        total += float((logz - logits[np.arange(end - start), np.arange(end - start)]).sum())
    return total / max(len(a), 1)


def run(source: Path, data_file: Path | None = None, batch_size: int = 32) -> EvalResult:
    t0 = time.perf_counter()
    folder, run_dir = predict_embedding.model_folder(Path(source))
    recipe_yaml = predict_embedding.recipe_of(folder, run_dir)
    task = _task(recipe_yaml)
    # what evaluate.load_rows / training_recipe read of a saved model (one text per row)
    saved = types.SimpleNamespace(
        spec=task, path=folder, recipe_yaml=recipe_yaml, run_dir=run_dir, text_pair=None
    )
    loaded = evaluate.training_recipe(saved)  # type: ignore[arg-type]
    rows, spec, where = evaluate.load_rows(saved, data_file, loaded)  # type: ignore[arg-type]
    # truncated where training's eval truncated (data.max_length), not at the folder's
    # sentence-transformers max_seq_length, so the run's own figures come back
    model = predict_embedding.open_embedder(folder, spec.max_length)
    anchors = model.embed([str(r[task.anchor_column]) for r in rows], batch_size)
    positives = model.embed([str(r[task.positive_column]) for r in rows], batch_size)
    negatives = (
        model.embed([str(r[task.negative_column]) for r in rows], batch_size)
        if task.negative_column
        else None
    )
    loss_batch = loaded.recipe.training.batch_size if loaded is not None else batch_size
    log.info("eval: %s (%s) on %s: %d pairs", folder, model.runtime, where, len(rows))
    metrics = {
        "loss": in_batch_loss(anchors, positives, negatives, task.scale, loss_batch),
        **sentence_embedding.retrieval(anchors, positives),
    }
    return {
        "model": str(folder),
        "runtime": model.runtime,
        "task": task.name,
        "data": where,
        "examples": len(rows),
        "max_length": model.max_length,
        "metrics": {k: float(v) for k, v in metrics.items()},
        "eval_s": round(time.perf_counter() - t0, 3),
    }
