"""Core: the torch-free leaves every other package may import, and that import nothing of
ortft: the error hierarchy and its exit codes (``errors``), atomic writes and the run lock
(``fsutil``), progress and logging on stderr (``progress``), shared constants (``constants``),
the strict pydantic base for recipe sections (``section``) and the JSON shapes that cross
layers (``reports``)."""
