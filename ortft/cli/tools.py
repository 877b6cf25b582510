"""The commands around training: ``bench``, ``hpo``, ``doctor``, ``init``, ``recipes``, ``schema``,
``plot`` and the ``cache`` group (``cache list``, ``cache prune``); each one's work is in
``ortft.tools`` (``plot``'s in ``ortft.run.curves``, which also draws a run's own curves.png)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from ortft.cli.common import guarded, json_option, state, thread_env
from ortft.cli.output import echo_json, quiet_libraries


def bench(
    recipe: Annotated[Path, typer.Argument(help="Recipe YAML file.", show_default=False)],
    backends: Annotated[
        str | None,
        typer.Option(
            "--backends",
            help="Comma-separated: ort, torch, torch-eager-attn, torch-compile; "
            "each may add +key=value (a recipe key or an ORTFT_* variable). "
            "Default: ort,torch where ONNX Runtime training is installed, "
            "else torch,torch-compile.",
            show_default=False,
        ),
    ] = None,
    steps: Annotated[int, typer.Option("--steps", help="Training steps per run.")] = 20,
    warmup: Annotated[
        int, typer.Option("--warmup", help="First steps of each run left untimed.")
    ] = 2,
    repeats: Annotated[int, typer.Option("--repeats", help="Runs per backend, alternating.")] = 2,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds allowed per run.")] = 900.0,
    limit: Annotated[
        str,
        typer.Option(
            "--limit",
            help="The measured matmul limit at the model's GEMM shapes: cached (measure only "
            "shapes not in ORTFT_CACHE), refresh (measure again, keep the better rate) or off.",
        ),
    ] = "cached",
    as_json: Annotated[bool, json_option("Print the results as JSON on stdout.")] = False,
    plot_path: Annotated[
        Path | None, typer.Option("--plot", help="Write a PNG bar chart (needs matplotlib).")
    ] = None,
) -> None:
    """Benchmark backends side by side on a recipe, each run in its own process; torch is the baseline."""

    def body() -> None:
        from ortft.core.errors import RunError
        from ortft.tools import bench as bench_mod

        quiet_libraries(state["debug"])
        result = bench_mod.run(recipe, backends, steps, warmup, repeats, timeout, limit)
        bench_mod.print_table(result)
        if plot_path is not None:
            bench_mod.plot(result, plot_path)
        if as_json:
            echo_json(result)
        if result["failed"]:
            raise RunError(f"bench: {', '.join(result['failed'])} failed (see the table)")

    guarded(body)


def init(
    task: Annotated[
        str,
        typer.Option(
            "--task",
            help="A task whose family has a starter recipe (another name lists them).",
        ),
    ] = "sequence-classification",
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write here instead of stdout.")
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing file.")] = False,
) -> None:
    """Write a commented starter recipe."""

    def body() -> None:
        from ortft.tools import starter

        text = starter.recipe_text(task)
        if output is None:
            typer.echo(text, nl=False)
            return
        if output.exists() and not force:
            from ortft.core.errors import UsageError

            raise UsageError(f"{output} exists; pass --force to overwrite it")
        output.write_text(text)
        typer.echo(str(output))

    guarded(body)


def list_recipes() -> None:
    """List the shipped recipes."""
    from ortft.tools import starter

    for path, summary in starter.shipped_recipes():
        typer.echo(f"{path}\t{summary}")


cache_app = typer.Typer(
    help="List and prune the data caches (tokenized splits, rows in Arrow) under ORTFT_CACHE.",
    no_args_is_help=True,
)


@cache_app.command("list")
def cache_list(
    as_json: Annotated[bool, json_option("One JSON list of entries on stdout.")] = False,
) -> None:
    """Each cache entry: kind, size, age, rows and the source it was made from."""
    from ortft.tools import cache

    found = guarded(cache.entries)
    typer.echo(json.dumps(found, indent=2) if as_json else cache.format_table(found))


@cache_app.command("prune")
def cache_prune(
    older_than: Annotated[
        str | None, typer.Option("--older-than", help="Remove entries older than this (7d, 12h).")
    ] = None,
    everything: Annotated[bool, typer.Option("--all", help="Remove every entry.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List what would go.")] = False,
    as_json: Annotated[bool, json_option("The removed entries as JSON on stdout.")] = False,
) -> None:
    """Remove cache entries (rebuilt by the next run that needs them); incomplete ones always."""
    from ortft.tools import cache

    gone = guarded(cache.prune, older_than, everything, dry_run)
    verb = "would be removed" if dry_run else "removed"
    typer.echo(json.dumps(gone, indent=2) if as_json else cache.format_table(gone, verb))


def doctor(
    as_json: Annotated[bool, json_option("Machine-readable report on stdout.")] = False,
    fix: Annotated[
        bool, typer.Option("--fix", help="Build ORTModule's C++ extensions if they are missing.")
    ] = False,
) -> None:
    """Check the environment against the known-good stack; a report to paste in bug reports."""
    from ortft.tools import doctor as doctor_mod

    raise typer.Exit(guarded(doctor_mod.main, as_json=as_json, fix=fix))


def hpo(
    recipe: Annotated[
        Path, typer.Argument(help="Recipe YAML file with an hpo: section.", show_default=False)
    ],
    overrides: Annotated[
        list[str] | None, typer.Argument(help="Dotted overrides applied to every trial.")
    ] = None,
    trials: Annotated[
        int, typer.Option("--trials", "-n", min=1, help="Finished trials wanted in the study.")
    ] = 10,
    study: Annotated[
        str | None, typer.Option("--study", help="Study name (default: the recipe stem).")
    ] = None,
    storage: Annotated[
        str | None,
        typer.Option(
            "--storage", help="Optuna storage URL (default: sqlite:///<output-dir>/study.db)."
        ),
    ] = None,
    output_dir: Annotated[
        Path | None,
        typer.Option(
            "--output-dir", "-o", help="Folder for trial runs (default: runs/<stem>-hpo)."
        ),
    ] = None,
    as_json: Annotated[bool, json_option("Print the study as JSON on stdout.")] = False,
) -> None:
    """Search hyperparameters with Optuna (median pruning; resumable SQLite study)."""

    def body() -> None:
        from ortft.recipe import io as recipe_io
        from ortft.tools import hpo as hpo_mod

        thread_env(recipe_io.load(recipe, overrides or []).recipe.backend.name)
        quiet_libraries(state["debug"])
        result = hpo_mod.run(recipe, overrides or [], trials, study, storage, output_dir)
        typer.echo(json.dumps(result, indent=2) if as_json else hpo_mod.format_table(result))

    guarded(body)


def schema(
    markdown: Annotated[
        bool,
        typer.Option(
            "--markdown", help="The Markdown reference (docs/recipe-reference.md) instead."
        ),
    ] = False,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write here instead of stdout.")
    ] = None,
) -> None:
    """Print the recipe's JSON Schema (docs/recipe.schema.json: editors check recipes with it)."""
    from ortft.tools import schema_doc

    text = schema_doc.reference() if markdown else schema_doc.schema_text()
    if output is None:
        typer.echo(text, nl=False)
        return
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text, encoding="utf-8")
    typer.echo(str(output))


def plot(
    runs: Annotated[
        list[Path], typer.Argument(help="Run folders (with metrics.jsonl).", show_default=False)
    ],
    output: Annotated[Path, typer.Option("--output", "-o", help="PNG to write.")] = Path(
        "curves.png"
    ),
    report: Annotated[
        Path | None,
        typer.Option("--report", help="Also add the picture to this Markdown report (FILE.md)."),
    ] = None,
) -> None:
    """Draw loss, learning rate and eval metrics over steps for one or several runs (needs matplotlib)."""

    def body() -> None:
        from ortft.run import curves

        if report is not None and report.suffix.lower() != ".md":
            from ortft.core.errors import UsageError

            raise UsageError(f"--report {report}: the picture goes into a .md (Markdown) report")
        curves.plot_runs(runs, output)
        if report is not None:
            curves.embed(report, output)
        typer.echo(str(output))

    guarded(body)
