"""The command line: the Typer app (``app.py``: global options, ``main``, the command list), one
module per command group (``train.py``, ``export.py``, ``inference.py``, ``tools.py``), the
output helpers (``output.py``: results on stdout, errors and chatter on stderr) and what the
commands share (``common.py``: --debug, errors turned into one line and an exit code)."""
