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
from ortft.cli.output import echo_json, emit_summary, quiet_libraries, report_failed_run
from ortft.cli.output import err as _err
from ortft.core.errors import EXIT_USAGE, OrtftError

app = typer.Typer(
    name="ortft",
    help="Fine-tune Hugging Face transformers from a YAML recipe, trained through ONNX Runtime.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    add_completion=False,
    rich_markup_mode=None,
)

_state = {"debug": False}


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


# the argument `ortft eval` and `ortft predict` share
TrainedModel = Annotated[
    Path,
    typer.Argument(help="Run dir, saved HF model dir, or ONNX export folder.", show_default=False),
]


def _json(help: str) -> Any:
    """The --json flag of every command that prints a result."""
    return typer.Option("--json", help=help)


def _thread_env(backend: str) -> None:
    """The backend's process environment (ORT: libgomp's spin count), set before torch loads."""
    import os

    from ortft import backends

    if "torch" not in sys.modules:
        for key, value in backends.process_env(backend).items():
            os.environ.setdefault(key, value)


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
        Path | None,
        typer.Option("--output-dir", "-o", help="Run directory (overrides the recipe)."),
    ] = None,
    as_json: Annotated[bool, _json("Print the run summary as JSON on stdout.")] = False,
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
    _run(_train, recipe, overrides or [], output_dir, as_json, gate or [], report or [])


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
        _err("--nproc inside torchrun: drop --nproc (torchrun already started the processes)")
        return EXIT_USAGE
    torchrun = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    ortft = ["-m", "ortft", *(["--debug"] if _state["debug"] else []), "train", str(recipe)]
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
    from ortft.run import gates
    from ortft.tools import ci_report

    ci_report.check_paths(report)
    for text in gate:
        gates.parse(text)  # a malformed gate is a usage error before anything runs
    loaded = recipe_io.load(recipe, overrides)
    _thread_env(loaded.recipe.backend.name)
    # ort-ondevice trains without PyTorch (only building its artifacts imports it, lazily)
    quiet_libraries(_state["debug"], with_torch=loaded.recipe.backend.name != "ort-ondevice")
    from ortft.run import lifecycle

    run_dir = lifecycle.resolve_run_dir(loaded, output_dir)
    try:
        summary = lifecycle.run(loaded, output_dir=output_dir, extra_gates=gate)
    except GateError as err:
        emit_summary(err.summary, as_json, report)
        raise
    except OrtftError:
        report_failed_run(report, run_dir)  # failed/interrupted runs get their report too
        raise
    if os.environ.get("RANK", "0") != "0":  # under torchrun, one process prints the result
        return
    emit_summary(summary, as_json, report)


@app.command()
def bench(
    recipe: Annotated[Path, typer.Argument(help="Recipe YAML file.", show_default=False)],
    backends: Annotated[
        str,
        typer.Option(
            "--backends",
            help="Comma-separated: ort, torch, torch-eager-attn, torch-compile; "
            "each may add +key=value (a recipe key or an ORTFT_* variable).",
        ),
    ] = "ort,torch",
    steps: Annotated[int, typer.Option("--steps", help="Training steps per run.")] = 20,
    warmup: Annotated[
        int, typer.Option("--warmup", help="First steps of each run left untimed.")
    ] = 2,
    repeats: Annotated[int, typer.Option("--repeats", help="Runs per backend, alternating.")] = 2,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds allowed per run.")] = 900.0,
    as_json: Annotated[bool, _json("Print the results as JSON on stdout.")] = False,
    plot_path: Annotated[
        Path | None, typer.Option("--plot", help="Write a PNG bar chart (needs matplotlib).")
    ] = None,
) -> None:
    """Benchmark backends side by side on a recipe, each run in its own process; torch is the baseline."""

    def body() -> None:
        from ortft.core.errors import RunError
        from ortft.tools import bench as bench_mod

        quiet_libraries(_state["debug"])
        result = bench_mod.run(recipe, backends, steps, warmup, repeats, timeout)
        bench_mod.print_table(result)
        if plot_path is not None:
            bench_mod.plot(result, plot_path)
        if as_json:
            echo_json(result)
        if result["failed"]:
            raise RunError(f"bench: {', '.join(result['failed'])} failed (see the table)")

    _run(body)


@app.command()
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

    _run(body)


@app.command("recipes")
def list_recipes() -> None:
    """List the shipped recipes."""
    from ortft.tools import starter

    for path, summary in starter.shipped_recipes():
        typer.echo(f"{path}\t{summary}")


cache_app = typer.Typer(
    help="List and prune the data caches (tokenized splits, rows in Arrow) under ORTFT_CACHE.",
    no_args_is_help=True,
)
app.add_typer(cache_app, name="cache")


@cache_app.command("list")
def cache_list(
    as_json: Annotated[bool, _json("One JSON list of entries on stdout.")] = False,
) -> None:
    """Each cache entry: kind, size, age, rows and the source it was made from."""
    from ortft.tools import cache

    found = _run(cache.entries)
    typer.echo(json.dumps(found, indent=2) if as_json else cache.format_table(found))


@cache_app.command("prune")
def cache_prune(
    older_than: Annotated[
        str | None, typer.Option("--older-than", help="Remove entries older than this (7d, 12h).")
    ] = None,
    everything: Annotated[bool, typer.Option("--all", help="Remove every entry.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List what would go.")] = False,
    as_json: Annotated[bool, _json("The removed entries as JSON on stdout.")] = False,
) -> None:
    """Remove cache entries (rebuilt by the next run that needs them); incomplete ones always."""
    from ortft.tools import cache

    gone = _run(cache.prune, older_than, everything, dry_run)
    verb = "would be removed" if dry_run else "removed"
    typer.echo(json.dumps(gone, indent=2) if as_json else cache.format_table(gone, verb))


@app.command()
def doctor(
    as_json: Annotated[bool, _json("Machine-readable report on stdout.")] = False,
    fix: Annotated[
        bool, typer.Option("--fix", help="Build ORTModule's C++ extensions if they are missing.")
    ] = False,
) -> None:
    """Check the environment against the known-good stack; a report to paste in bug reports."""
    from ortft.tools import doctor as doctor_mod

    raise typer.Exit(_run(doctor_mod.main, as_json=as_json, fix=fix))


@app.command()
def export(
    source: Annotated[
        Path, typer.Argument(help="Run dir, checkpoint or saved HF model dir.", show_default=False)
    ],
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Output folder (default SOURCE/onnx).")
    ] = None,
    opset: Annotated[int, typer.Option("--opset", min=14, max=20, help="ONNX opset (14-20).")] = 20,
    tolerance: Annotated[
        float, typer.Option("--tolerance", help="Max |ONNX - PyTorch| allowed.")
    ] = 1e-4,
    optimize: Annotated[
        bool, typer.Option("--optimize", help="Also write model.opt.onnx (ORT graph optimization).")
    ] = False,
    fp16: Annotated[bool, typer.Option("--fp16", help="Also write model.fp16.onnx.")] = False,
    quantize: Annotated[
        str | None,
        typer.Option("--quantize", help="Also write model.int8.onnx (dynamic quantization): int8."),
    ] = None,
    training_artifacts: Annotated[
        bool,
        typer.Option(
            "--training-artifacts", help="Also write on-device training artifacts to OUT/training/."
        ),
    ] = False,
    trainable: Annotated[
        list[str] | None,
        typer.Option(
            "--trainable",
            help="Glob over parameter names to train on device (repeatable; "
            "default all), e.g. 'classifier.*'.",
        ),
    ] = None,
    merge_adapters: Annotated[
        bool,
        typer.Option(
            "--merge-adapters",
            help="Fold a LoRA run's adapter (final/adapter/) into the base model before export.",
        ),
    ] = False,
    kv_cache: Annotated[
        bool,
        typer.Option(
            "--kv-cache/--no-kv-cache",
            help="Decoders: the graph with a KV cache (past_key_values in, present out), or "
            "without (the whole sequence each step).",
        ),
    ] = True,
    check_runtime: Annotated[
        list[str] | None,
        typer.Option(
            "--check-runtime",
            help="A Python with another onnxruntime (e.g. a deployment venv's bin/python): "
            "load the export there and compare its outputs; recorded in export.json "
            "(repeatable).",
        ),
    ] = None,
    as_json: Annotated[bool, _json("Print export.json on stdout.")] = False,
) -> None:
    """Export a trained model to ONNX and check it against PyTorch."""

    def body() -> None:
        from ortft.core.errors import UsageError
        from ortft.export import exporter as export_mod

        if trainable and not training_artifacts:
            raise UsageError("--trainable needs --training-artifacts")
        if quantize not in (None, "int8"):
            raise UsageError(f"--quantize {quantize}: the choice is int8")
        quiet_libraries(_state["debug"])
        report = export_mod.export_source(
            source,
            output,
            opset=opset,
            tolerance=tolerance,
            optimize=optimize,
            fp16=fp16,
            quantize=quantize,
            training_artifacts=training_artifacts,
            trainable=trainable,
            merge_adapters=merge_adapters,
            kv_cache=kv_cache,
            check_runtimes=check_runtime or (),
        )
        typer.echo(json.dumps(report, indent=2) if as_json else report["dir"])

    _run(body)


@app.command("eval")
def eval_cmd(
    source: TrainedModel,
    data_file: Annotated[
        Path | None,
        typer.Option(
            "--data",
            help="Data to score (any format training reads); default: the run's eval split.",
        ),
    ] = None,
    batch_size: Annotated[
        int, typer.Option("--batch-size", min=1, help="Examples per forward.")
    ] = 32,
    as_json: Annotated[bool, _json("Print the result as JSON on stdout.")] = False,
) -> None:
    """Evaluate a saved model (PyTorch or its ONNX export) with the metrics training reports."""

    def body() -> None:
        from ortft.inference import evaluate

        quiet_libraries(_state["debug"])
        result = evaluate.run(source, data_file, batch_size)
        typer.echo(json.dumps(result, indent=2) if as_json else evaluate.format_result(result))

    _run(body)


@app.command()
def predict(
    source: TrainedModel,
    input_path: Annotated[
        str,
        typer.Option(
            "--input",
            "-i",
            help="Texts, one per line, or JSONL ('text'; token-cls: or 'tokens'; QA: 'question' and 'context'); - for stdin.",
        ),
    ] = "-",
    max_new_tokens: Annotated[
        int,
        typer.Option(
            "--max-new-tokens",
            min=1,
            help="causal-lm, instruction, seq2seq: tokens to generate (greedy).",
        ),
    ] = 32,
    max_length: Annotated[
        int | None,
        typer.Option(
            "--max-length",
            min=1,
            help="Truncate inputs to this many tokens (default: the training length; not causal LMs).",
        ),
    ] = None,
    as_json: Annotated[bool, _json("One JSON object per input on stdout.")] = False,
) -> None:
    """Run a trained model on inputs: a label, tags per word, an answer span, filled masks or text."""

    def body() -> None:
        from ortft.inference import predict as predict_mod

        quiet_libraries(_state["debug"])
        for result in predict_mod.run(
            source, input_path, max_new_tokens=max_new_tokens, max_length=max_length
        ):
            typer.echo(json.dumps(result) if as_json else predict_mod.format_line(result))

    _run(body)


@app.command()
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
    as_json: Annotated[bool, _json("Print the study as JSON on stdout.")] = False,
) -> None:
    """Search hyperparameters with Optuna (median pruning; resumable SQLite study)."""

    def body() -> None:
        from ortft.recipe import io as recipe_io
        from ortft.tools import hpo as hpo_mod

        _thread_env(recipe_io.load(recipe, overrides or []).recipe.backend.name)
        quiet_libraries(_state["debug"])
        result = hpo_mod.run(recipe, overrides or [], trials, study, storage, output_dir)
        typer.echo(json.dumps(result, indent=2) if as_json else hpo_mod.format_table(result))

    _run(body)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
