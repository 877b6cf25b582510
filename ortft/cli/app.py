"""The ``ortft`` command line: the Typer app, its global options and the command list.

Each command is a short function in the module of its group (``train.py``: train, validate;
``export.py``; ``inference.py``: eval, predict; ``tools.py``: bench, hpo, doctor, init, recipes,
cache), registered here in the order ``ortft --help`` lists them. ``common.guarded`` turns an
error into one line and an exit code. Results go to stdout (paths, JSON with --json); progress
and errors go to stderr. Heavy libraries (torch, onnxruntime, transformers) are imported inside
the commands, so ``ortft --help`` and ``ortft --version`` stay instant.
"""

from __future__ import annotations

from typing import Annotated

import typer

from ortft import __version__
from ortft.cli import export, inference, tools, train
from ortft.cli.common import state

app = typer.Typer(
    name="ortft",
    help="Fine-tune Hugging Face transformers from a YAML recipe, trained through ONNX Runtime.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    add_completion=False,
    rich_markup_mode=None,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"ortft {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks for errors.")] = False,
) -> None:
    state["debug"] = debug


# the order `ortft --help` lists them in
app.command(context_settings={"allow_extra_args": False})(train.train)
app.command()(tools.bench)
app.command()(train.validate)
app.command()(tools.schema)
app.command()(tools.init)
app.command("recipes")(tools.list_recipes)
app.command()(tools.plot)
app.add_typer(tools.cache_app, name="cache")
app.command()(tools.doctor)
app.command()(export.export)
app.command("eval")(inference.eval_cmd)
app.command()(inference.predict)
app.command()(tools.hpo)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
