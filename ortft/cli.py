"""The ``ortft`` command line: one function per command; errors become one line + exit code.

Results go to stdout (paths, JSON with --json); progress and errors go to stderr.
Heavy libraries (torch, onnxruntime, transformers) are imported inside the commands, so
``ortft --help`` and ``ortft --version`` stay instant.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from ortft import __version__
from ortft.errors import EXIT_USAGE, OrtftError

app = typer.Typer(
    name="ortft",
    help="Fine-tune Hugging Face transformers from a YAML recipe, trained through ONNX Runtime.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    add_completion=False,
    rich_markup_mode=None,
)

_state = {"debug": False}


def _err(message: str) -> None:
    sys.stderr.write(f"error: {message}\n")
    sys.stderr.flush()


def _run(fn, *args: Any, **kwargs: Any) -> Any:
    """Call a command body, turning OrtftError (and Ctrl-C) into a message and exit code."""
    try:
        return fn(*args, **kwargs)
    except OrtftError as err:
        if _state["debug"]:
            raise
        _err(str(err))
        raise typer.Exit(err.exit_code) from None
    except KeyboardInterrupt:
        _err("interrupted")
        raise typer.Exit(130) from None


def _quiet_libraries() -> None:
    """Our own progress on stderr; the libraries' chatter only with --debug."""
    import logging
    import os
    import warnings

    from ortft.progress import setup_logging

    setup_logging(logging.DEBUG if _state["debug"] else logging.INFO)
    if not _state["debug"]:
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        warnings.filterwarnings("ignore")


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
    _state["debug"] = debug


# --------------------------------------------------------------------------- train


@app.command(context_settings={"allow_extra_args": False})
def train(
    recipe: Annotated[Path, typer.Argument(help="Recipe YAML file.", show_default=False)],
    overrides: Annotated[
        list[str] | None,
        typer.Argument(help="Dotted overrides, e.g. training.max_steps=20 backend.name=torch."),
    ] = None,
    output_dir: Annotated[
        Path | None, typer.Option("--output-dir", "-o", help="Run directory (overrides the recipe).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the run summary as JSON on stdout.")] = False,
) -> None:
    """Train a model from a recipe; writes checkpoints, final/ and the ONNX export."""

    def body() -> None:
        from ortft import recipe_io
        from ortft import train as train_mod

        _quiet_libraries()
        loaded = recipe_io.load(recipe, overrides or [])
        summary = train_mod.run(loaded, output_dir=output_dir)
        if as_json:
            typer.echo(json.dumps(summary, indent=2))
        else:
            typer.echo(summary["paths"]["run_dir"])

    _run(body)


@app.command()
def validate(
    recipes: Annotated[list[Path], typer.Argument(help="Recipe YAML files.", show_default=False)],
    overrides: Annotated[
        list[str] | None, typer.Option("--set", help="Dotted override applied to each recipe.")
    ] = None,
) -> None:
    """Validate recipes without training; report every problem at once."""
    from ortft import recipe_io

    failed = 0
    for path in recipes:
        try:
            recipe_io.load(path, overrides or [])
            typer.echo(f"ok  {path}")
        except OrtftError as err:
            failed += 1
            _err(str(err))
    if failed:
        raise typer.Exit(EXIT_USAGE)


@app.command()
def init(
    task: Annotated[
        str, typer.Option("--task", help="sequence-classification or causal-lm.")
    ] = "sequence-classification",
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write here instead of stdout.")
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing file.")] = False,
) -> None:
    """Write a commented starter recipe."""

    def body() -> None:
        from ortft import starter

        text = starter.recipe_text(task)
        if output is None:
            typer.echo(text, nl=False)
            return
        if output.exists() and not force:
            from ortft.errors import UsageError

            raise UsageError(f"{output} exists; pass --force to overwrite it")
        output.write_text(text)
        typer.echo(str(output))

    _run(body)


@app.command("recipes")
def list_recipes() -> None:
    """List the shipped recipes."""
    from ortft import starter

    for path, summary in starter.shipped_recipes():
        typer.echo(f"{path}\t{summary}")


@app.command()
def doctor(
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable report on stdout.")] = False,
    fix: Annotated[
        bool, typer.Option("--fix", help="Build ORTModule's C++ extensions if they are missing.")
    ] = False,
) -> None:
    """Check the environment against the known-good stack; a report to paste in bug reports."""
    from ortft import doctor as doctor_mod

    raise typer.Exit(_run(doctor_mod.main, as_json=as_json, fix=fix))


@app.command()
def export(
    source: Annotated[Path, typer.Argument(help="Run dir, checkpoint or saved HF model dir.", show_default=False)],
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Output folder (default SOURCE/onnx).")] = None,
    opset: Annotated[int, typer.Option("--opset", help="ONNX opset.")] = 17,
    tolerance: Annotated[float, typer.Option("--tolerance", help="Max |ONNX - PyTorch| allowed.")] = 1e-4,
    as_json: Annotated[bool, typer.Option("--json", help="Print export.json on stdout.")] = False,
) -> None:
    """Export a trained model to ONNX and check it against PyTorch."""

    def body() -> None:
        from ortft import export as export_mod

        _quiet_libraries()
        report = export_mod.export_source(source, output, opset=opset, tolerance=tolerance)
        typer.echo(json.dumps(report, indent=2) if as_json else report["model"])

    _run(body)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
