"""``ortft train`` (in this process, or in N under torchrun with --nproc) and ``ortft validate``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from ortft.cli.common import guarded, json_option, state, thread_env
from ortft.cli.output import emit_summary, err, quiet_libraries, report_failed_run
from ortft.core.errors import EXIT_USAGE, OrtftError


def train(
    recipe: Annotated[Path, typer.Argument(help="Recipe YAML file.", show_default=False)],
    overrides: Annotated[
        list[str] | None,
        typer.Argument(help="Dotted overrides, e.g. training.max_steps=20 backend.name=torch."),
    ] = None,
    output_dir: Annotated[
        Path | None,
        typer.Option("--output-dir", "-o", help="Run directory (overrides the recipe)."),
    ] = None,
    as_json: Annotated[bool, json_option("Print the run summary as JSON on stdout.")] = False,
    gate: Annotated[
        list[str] | None,
        typer.Option(
            "--gate", help="Quality gate, e.g. eval.accuracy>=0.9 (repeatable); exit 3 if it fails."
        ),
    ] = None,
    report: Annotated[
        list[Path] | None,
        typer.Option(
            "--report",
            help="Write a CI report: FILE.xml (JUnit) or FILE.md (Markdown); repeatable.",
        ),
    ] = None,
    nproc: Annotated[
        int | None,
        typer.Option(
            "--nproc",
            min=1,
            help="Data-parallel processes on this machine: runs "
            "`python -m torch.distributed.run --nproc_per_node N -m ortft train ...`.",
        ),
    ] = None,
) -> None:
    """Train a model from a recipe; writes checkpoints, final/ and the ONNX export."""
    if nproc is not None:  # torchrun starts the processes; each runs this command without --nproc
        raise typer.Exit(_torchrun(nproc, recipe, overrides, output_dir, as_json, gate, report))
    guarded(_train, recipe, overrides or [], output_dir, as_json, gate or [], report or [])


def _torchrun(
    nproc: int,
    recipe: Path,
    overrides: list[str] | None,
    output_dir: Path | None,
    as_json: bool,
    gate: list[str] | None,
    report: list[Path] | None,
) -> int:
    """`ortft train --nproc N`: the same command in N processes under torchrun; its exit code."""
    import os
    import subprocess

    if "WORLD_SIZE" in os.environ:
        err("--nproc inside torchrun: drop --nproc (torchrun already started the processes)")
        return EXIT_USAGE
    torchrun = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    ortft = ["-m", "ortft", *(["--debug"] if state["debug"] else []), "train", str(recipe)]
    options = [*(["--output-dir", str(output_dir)] if output_dir else [])]
    options += [*(["--json"] if as_json else []), *[f"--gate={g}" for g in gate or []]]
    options += [f"--report={p}" for p in report or []]
    cmd = [sys.executable, *torchrun, *ortft, *(overrides or []), *options]
    return subprocess.call(cmd)


def _train(
    recipe: Path,
    overrides: list[str],
    output_dir: Path | None,
    as_json: bool,
    gate: list[str],
    report: list[Path],
) -> None:
    import os

    from ortft.core.errors import GateError
    from ortft.recipe import io as recipe_io
    from ortft.recipe.backends import check_installed
    from ortft.run import gates
    from ortft.tools import ci_report

    ci_report.check_paths(report)
    for text in gate:
        gates.parse(text)  # a malformed gate is a usage error before anything runs
    loaded = recipe_io.load(recipe, overrides)
    check_installed(loaded.recipe)  # the run checks it too; here before torch's import
    thread_env(loaded.recipe.backend.name)
    # ort-ondevice trains without PyTorch (only building its artifacts imports it, lazily)
    quiet_libraries(state["debug"], with_torch=loaded.recipe.backend.name != "ort-ondevice")
    from ortft.run import lifecycle

    run_dir = lifecycle.resolve_run_dir(loaded, output_dir)
    try:
        summary = lifecycle.run(loaded, output_dir=output_dir, extra_gates=gate)
    except GateError as error:
        emit_summary(error.summary, as_json, report)
        raise
    except OrtftError:
        report_failed_run(report, run_dir)  # failed/interrupted runs get their report too
        raise
    if os.environ.get("RANK", "0") != "0":  # under torchrun, one process prints the result
        return
    emit_summary(summary, as_json, report)


def validate(
    recipes: Annotated[list[Path], typer.Argument(help="Recipe YAML files.", show_default=False)],
    overrides: Annotated[
        list[str] | None, typer.Option("--set", help="Dotted override applied to each recipe.")
    ] = None,
) -> None:
    """Validate recipes without training; report every problem at once."""
    from ortft.recipe import io as recipe_io

    failed = 0
    for path in recipes:
        try:
            recipe_io.load(path, overrides or [])
            typer.echo(f"ok  {path}")
        except OrtftError as error:
            failed += 1
            err(str(error))
    if failed:
        raise typer.Exit(EXIT_USAGE)
