"""Data: rows from files, folders, saved datasets or the Hub, checked, into memory-mapped Arrow
(``rows``, ``checks``; input paths in ``paths``), a run's train and eval splits (``splits``), their
token arrays and the tokenized cache (``tokenized``, ``encoded``; ``streaming`` for rows never
stored), batches (``batches``), and the recipe's ``data:`` section (``spec``).

Below tasks and the recipe: data takes a ``DataSection`` and a folder, never a recipe, and asks
of a task only what the protocols ``checks.RowColumns`` and ``encoded.Encoder`` name.
"""
