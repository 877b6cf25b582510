"""The run's tokenizer or processor for the torch-based engine: the family's own, the model's,
or one trained on the training rows; saved in the run (``tokenizer/``, ``processor/``) by rank
0, so a resume and the other ranks load the same one.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from ortft.backends.torch import distributed, load_checks, models
from ortft.data import checks
from ortft.recipe.io import LoadedRecipe
from ortft.tasks import protocols

log = logging.getLogger("ortft")


def load(loaded: LoadedRecipe, run_dir: Path, task: Any, train_rows: list) -> Any:
    """The model's tokenizer or processor, else one trained here; rank 0 saves it."""
    if isinstance(task, protocols.LoadsTokenizer):  # the family's own (text-to-image's CLIP)
        return task.load_tokenizer(loaded, run_dir)
    models.check_fits(loaded, task)  # a folder of another kind: why, before its files load
    if isinstance(task, protocols.ReadsFiles):  # its processor, where text has a tokenizer
        return processor(loaded, run_dir, task, train_rows)
    r = loaded.recipe
    tok_dir = run_dir / "tokenizer"
    if not distributed.is_main():
        distributed.barrier()
    saved = tok_dir if tok_dir.exists() else None
    sample = checks.texts(task, load_checks.sample_rows(train_rows), r.data) if not saved else []
    tokenizer = models.load_tokenizer(loaded, saved_dir=saved, sample_texts=sample)
    if tokenizer is None:  # the recipe's rules: no tokenizer to load means train: is set
        spec: Any = r.model.tokenizer.train
        tokenizer = models.train_tokenizer(checks.texts(task, train_rows, r.data), spec)
        log.info("trained a %s tokenizer: %d tokens", spec.kind, len(tokenizer))
    if not tok_dir.exists():
        tokenizer.save_pretrained(tok_dir)
    if distributed.is_main():
        distributed.barrier()  # the saved tokenizer is there for the other ranks
    return tokenizer


def processor(loaded: LoadedRecipe, run_dir: Path, task: Any, rows: Any) -> Any:
    """The processor of a task whose rows are files: the family's own
    (``protocols.LoadsProcessor``: the model's, or one for a from_config model); saved in the
    run as the tokenizer is."""
    if not isinstance(task, protocols.LoadsProcessor):  # before the ranks wait on each other
        raise TypeError(
            f"task {task.name} reads {task.modality} files: it needs a load_processor "
            "(ortft.tasks.protocols.LoadsProcessor)"
        )
    spec, proc_dir = loaded.recipe.model, run_dir / "processor"
    if not distributed.is_main():
        distributed.barrier()
    saved = proc_dir if proc_dir.exists() else None
    source = models.model_source(loaded, spec.name_or_path) if spec.name_or_path else None
    out = task.load_processor(loaded, source, saved, rows)
    if not proc_dir.exists():
        out.save_pretrained(proc_dir)
    if distributed.is_main():
        distributed.barrier()
    return out
