"""The run's tokenizer or processor for the torch-based engine: the family's own, the model's,
or one trained on the training rows; saved in the run (``tokenizer/``, ``processor/``) by rank
0, so a resume and the other ranks load the same one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
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

    def tokenizer(saved: Path | None) -> Any:
        sample = [] if saved else checks.texts(task, load_checks.sample_rows(train_rows), r.data)
        loaded_tok = models.load_tokenizer(loaded, saved_dir=saved, sample_texts=sample)
        if loaded_tok is not None:
            return loaded_tok
        # the recipe's rules: no tokenizer to load means train: is set
        spec: Any = r.model.tokenizer.train
        trained = models.train_tokenizer(checks.texts(task, train_rows, r.data), spec)
        log.info("trained a %s tokenizer: %d tokens", spec.kind, len(trained))
        return trained

    return _saved_in_run(run_dir / "tokenizer", tokenizer)


def processor(loaded: LoadedRecipe, run_dir: Path, task: Any, rows: Any) -> Any:
    """The processor of a task whose rows are files: the family's own
    (``protocols.LoadsProcessor``: the model's, or one for a from_config model); saved in the
    run as the tokenizer is."""
    if not isinstance(task, protocols.LoadsProcessor):  # before the ranks wait on each other
        raise TypeError(
            f"task {task.name} reads {task.modality} files: it needs a load_processor "
            "(ortft.tasks.protocols.LoadsProcessor)"
        )
    spec = loaded.recipe.model
    source = models.model_source(loaded, spec.name_or_path) if spec.name_or_path else None
    return _saved_in_run(
        run_dir / "processor", lambda saved: task.load_processor(loaded, source, saved, rows)
    )


def _saved_in_run(folder: Path, make: Callable[[Path | None], Any]) -> Any:
    """``make(folder if it was saved before, else None)``, saved to ``folder`` if it is not yet:
    rank 0 first, the other ranks after it, so they load what it saved."""
    if not distributed.is_main():
        distributed.barrier()
    made = make(folder if folder.exists() else None)
    if not folder.exists():
        made.save_pretrained(folder)
    if distributed.is_main():
        distributed.barrier()  # the saved folder is there for the other ranks
    return made
