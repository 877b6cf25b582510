"""``ortft export``: a trained model to ONNX, checked against PyTorch (``ortft.tools.export_source``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from ortft.cli.common import guarded, json_option, state
from ortft.cli.output import quiet_libraries
from ortft.env.unused import without_deepspeed

QUANTIZE_HELP = (
    "Also write model.int8.onnx (int8: dynamic quantization) or, for decoders, "
    "model.int4.onnx (int4: weight-only, MatMulNBits)."
)


def export(
    source: Annotated[
        str,
        typer.Argument(
            help="Run dir, checkpoint, saved HF model dir or pkg://<package>/<dir>.",
            show_default=False,
        ),
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
        typer.Option("--quantize", help=QUANTIZE_HELP),
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
    as_json: Annotated[bool, json_option("Print export.json on stdout.")] = False,
) -> None:
    """Export a trained model to ONNX and check it against PyTorch."""
    guarded(
        _export,
        source,
        output,
        as_json,
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


@without_deepspeed()
def _export(source: str, output: Path | None, as_json: bool, **options: Any) -> None:
    """The command's body: refuse option combinations that make no sense, then export.

    ``options`` are ``export_source``'s keyword arguments, as the command line gave them."""
    from ortft.core.errors import UsageError
    from ortft.data.paths import PKG_PREFIX, resolve_input_path
    from ortft.env import ort_training
    from ortft.tools.export_source import export_source

    if source.startswith(PKG_PREFIX) and output is None:  # SOURCE/onnx: inside site-packages
        raise UsageError(f"{source} is inside an installed package: pass -o OUT")
    if options["trainable"] and not options["training_artifacts"]:
        raise UsageError("--trainable needs --training-artifacts")
    if options["quantize"] not in (None, "int8", "int4"):
        raise UsageError(f"--quantize {options['quantize']}: choose int8 or int4")
    if options["training_artifacts"]:  # refused before the export, not after it
        missing = ort_training.missing(
            "--training-artifacts", "export without --training-artifacts"
        )
        if missing:
            raise UsageError(missing)
    quiet_libraries(state["debug"])
    path = resolve_input_path(source, Path.cwd()) if source.startswith(PKG_PREFIX) else Path(source)
    report = export_source(path, output, **options)
    typer.echo(json.dumps(report, indent=2) if as_json else report["dir"])
