"""``ortft eval`` and ``ortft predict``: a trained model (PyTorch or its ONNX export) on data."""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from ortft.cli.common import TrainedModel, guarded, json_option, state
from ortft.cli.output import quiet_libraries
from ortft.core.errors import InputError
from ortft.env.unused import without_deepspeed


def eval_cmd(
    source: TrainedModel,
    data_file: Annotated[
        Path | None,
        typer.Option(
            "--data",
            help="Data to score (any format training reads; images: a folder of class "
            "sub-folders or a csv/jsonl of paths; audio: a csv/jsonl of paths and transcripts; "
            "text-to-image: a csv/jsonl of image paths and captions or labels; a sentence-pair "
            "model: its training text columns, or 'text' and 'text_pair'); "
            "default: the run's eval split.",
        ),
    ] = None,
    batch_size: Annotated[
        int, typer.Option("--batch-size", min=1, help="Examples per forward.")
    ] = 32,
    as_json: Annotated[bool, json_option("Print the result as JSON on stdout.")] = False,
) -> None:
    """Evaluate a saved model (PyTorch or its ONNX export) with the metrics training reports."""

    @without_deepspeed()
    def body() -> None:
        from ortft import tasks
        from ortft.inference import evaluate

        quiet_libraries(state["debug"])
        family = tasks.folder_family(source, source / "final")
        embedder = tasks.embedder(source) if family is None else None
        if family is not None:  # a folder of a family's own layout (text-to-image's)
            result = family.evaluate_folder(source, data_file, batch_size)
        elif embedder is not None:  # retrieval, not logits (the embedding family's)
            result = embedder.evaluate_embeddings(source, data_file, batch_size)
        else:
            result = evaluate.run(source, data_file, batch_size)
        typer.echo(json.dumps(result, indent=2) if as_json else evaluate.format_result(result))

    guarded(body)


# text-to-image's drawing options (ortft.inference.predict.draw hands them to the family)
PromptOption = Annotated[
    str | None, typer.Option("--prompt", help="text-to-image: draw this prompt (with -o out.png).")
]
NegativeOption = Annotated[
    str | None, typer.Option("--negative-prompt", help="text-to-image: what to steer away from.")
]
GuidanceOption = Annotated[
    float,
    typer.Option("--guidance-scale", min=0.0, help="text-to-image: classifier-free guidance."),
]
HeightOption = Annotated[
    int | None,
    typer.Option("--height", min=8, help="text-to-image: pixels (default: the model's)."),
]
WidthOption = Annotated[
    int | None, typer.Option("--width", min=8, help="text-to-image: pixels (default: the model's).")
]
StepsOption = Annotated[int, typer.Option("--steps", min=1, help="text-to-image: denoising steps.")]
SeedOption = Annotated[
    int, typer.Option("--seed", help="text-to-image: the starting noise's seed.")
]


class Scheduler(StrEnum):  # the text-to-image family's runner.NAMES
    ddim = "ddim"
    euler = "euler"
    pndm = "pndm"


SchedulerOption = Annotated[
    Scheduler | None,
    typer.Option(
        "--scheduler", help="text-to-image: step with this scheduler (default: the model's)."
    ),
]
OutputOption = Annotated[
    Path | None, typer.Option("--output", "-o", help="text-to-image: the PNG to write.")
]
# the drawing options' names, in the order of predict's parameters (the family's DrawOptions)
DRAW_OPTIONS = (
    "prompt",
    "negative_prompt",
    "guidance_scale",
    "height",
    "width",
    "steps",
    "seed",
    "scheduler",
)


def predict(
    source: TrainedModel,
    input_path: Annotated[
        str,
        typer.Option(
            "--input",
            "-i",
            help="Texts, one per line, or JSONL ('text', a pair: + 'text_pair'; token-cls: or "
            "'tokens'; QA: 'question' and 'context'); image-cls and speech: image / audio paths, "
            "one per line (relative to the file), or a folder of them; - for stdin.",
        ),
    ] = "-",
    max_new_tokens: Annotated[
        int,
        typer.Option(
            "--max-new-tokens",
            min=1,
            help="causal-lm, instruction, seq2seq, speech: tokens to generate (greedy).",
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
    query: Annotated[
        str | None,
        typer.Option(
            "--query",
            help="A model that embeds: rank the inputs (passages) by cosine similarity to this "
            "text, best first.",
        ),
    ] = None,
    top_k: Annotated[
        int | None,
        typer.Option("--top-k", min=1, help="With --query: print the best N only."),
    ] = None,
    as_json: Annotated[bool, json_option("One JSON object per input on stdout.")] = False,
    prompt: PromptOption = None,
    negative_prompt: NegativeOption = None,
    guidance_scale: GuidanceOption = 7.5,
    height: HeightOption = None,
    width: WidthOption = None,
    steps: StepsOption = 20,
    seed: SeedOption = 0,
    scheduler: SchedulerOption = None,
    output: OutputOption = None,
) -> None:
    """Run a trained model on inputs: a label, tags per word, an answer span, filled masks, text,
    an image's label, an audio file's transcript, or a sentence embedding (--query: a ranking);
    a text-to-image model draws --prompt into -o out.png."""

    @without_deepspeed()
    def body() -> None:
        from ortft.inference import predict as predict_mod

        quiet_libraries(state["debug"])
        if prompt is not None or output is not None:  # text-to-image: draw one image
            if prompt is None or output is None:
                raise InputError("--prompt and -o/--output go together (text-to-image draws)")
            name = scheduler.value if scheduler else None
            opts = (prompt, negative_prompt, guidance_scale, height, width, steps, seed, name)
            drawn = predict_mod.draw(source, dict(zip(DRAW_OPTIONS, opts, strict=True)), output)
            typer.echo(json.dumps(drawn) if as_json else drawn["image"])
            return
        for result in predict_mod.run(
            source,
            input_path,
            max_new_tokens=max_new_tokens,
            max_length=max_length,
            query=query,
            top_k=top_k,
        ):
            typer.echo(json.dumps(result) if as_json else predict_mod.format_line(result))

    guarded(body)
