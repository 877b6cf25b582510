"""Data: rows from files, folders, saved datasets or the Hub, checked, into memory-mapped Arrow
(``rows``, ``checks``; input paths in ``paths``), a run's train and eval splits (``splits``), their
token arrays and the tokenized cache (``tokenized``, ``encoded``; ``streaming`` for rows never
stored), batches (``batches``), and the recipe's ``data:`` section (``spec``).

Below tasks and the recipe: data takes a ``DataSection`` and a folder, never a recipe, and asks
of a task only what ``encoded.Encoder`` names and what it declares through the small protocols
beside their readers (its columns, labels and files in ``checks``, label names in ``rows``,
``encoded.RowLocal``, ``batches.AlignsKeys``), with a default for a task without one.
"""
