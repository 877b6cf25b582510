"""Sentence embedding, one family: the task's options, rows, loss and retrieval metrics
(``task``), one lookup of the word table for every text kind (``lookup``), the
sentence-transformers pooling files (``pooling``), what the core calls on it
(``family``), the export and its model card (``graphs``), ``ortft predict`` (``predict``) and
``ortft eval`` (``eval_retrieval``) on a model that embeds, and ``ortft export`` of a text
encoder without a task head (``family.FeatureExtraction``). Reached through the task registry
(``ortft.tasks.BUILTIN``); importing this package imports no framework."""

from ortft.families.embedding.family import build
from ortft.families.embedding.task import Options

__all__ = ["Options", "build"]
