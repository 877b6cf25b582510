"""The recipe's ``data:`` section: what is read, how it is tokenized, how batches are cut."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from ortft.core.section import PositiveInt, Section

DataFormat = Literal["auto", "csv", "json", "jsonl", "parquet", "txt", "folder", "disk", "hub"]


class DataSection(Section):
    train: str = Field(
        description=(
            "Training data: a csv/json/jsonl/parquet/txt file, a folder of class sub-folders of "
            ".txt files (image tasks: of image files; audio tasks: a folder with a metadata.jsonl "
            "or metadata.csv naming its clips), a saved `datasets` directory, "
            "'pkg://<package>/<path>', or a Hub dataset name."
        )
    )
    eval: str | None = Field(None, description="Evaluation data (same forms as train).")
    eval_fraction: Annotated[float, Field(ge=0.0, lt=1.0)] = Field(
        0.1,
        description="Held-out share of train used for eval when neither `eval` nor `eval_split` is "
        "given (0: no eval).",
    )
    format: DataFormat = Field("auto", description="Input format; auto infers it from the path.")
    split: str = Field(
        "train",
        description="Split to read from a Hub dataset or a saved DatasetDict (a saved Dataset is "
        "one split: read whole).",
    )
    eval_split: str | None = Field(
        None,
        description="Eval rows: this split of train's Hub dataset or saved DatasetDict (used "
        "instead of eval_fraction; a source without splits is an error); with `eval`, the split "
        "read from it (default validation).",
    )
    decode_errors: Literal["strict", "replace"] = Field(
        "strict",
        description="Bytes that are not UTF-8: strict stops with the file and line; replace "
        "substitutes U+FFFD (for corpora with a few stray legacy-encoded bytes).",
    )
    text_column: str = Field("text", description="Column holding the text.")
    text_pair_column: str | None = Field(None, description="Second text column for pair tasks.")
    label_column: str = Field("label", description="Column holding the label (classification).")
    image_column: str = Field(
        "image",
        description="Image tasks: the column holding each image's file path (relative to the "
        "csv/jsonl file that names it).",
    )
    audio_column: str = Field(
        "audio",
        description="Audio tasks: the column holding each clip's file path (WAV, FLAC or OGG; "
        "relative to the csv/jsonl file that names it, or to the folder's metadata file).",
    )
    on_bad_file: Literal["error", "skip"] = Field(
        "error",
        description="Image and audio tasks: a missing, empty, corrupt, truncated or unreadable "
        "file stops with its path and row (error), or is left out and counted in summary.json's "
        "data (skip). Grayscale, palette, RGBA and 16-bit images are converted to RGB; stereo "
        "and other sample rates are converted to the model's mono rate; never refused.",
    )
    label_names: list[str] | None = Field(
        None, description="Label names in id order; default: the sorted distinct labels of train."
    )
    max_length: Annotated[int, Field(ge=8, le=8192)] = Field(
        128, description="Tokens per example at most: longer texts are truncated to this."
    )
    padding: Literal["longest", "buckets", "max_length"] = Field(
        "longest",
        description="How long each batch is: longest (the batch's longest row, rounded up to "
        "pad_to_multiple_of), buckets (the smallest of `buckets` that fits the longest row: few "
        "distinct shapes), or max_length (every batch padded to max_length). The model sees the "
        "same real tokens either way; padding only costs time.",
    )
    pad_to_multiple_of: Annotated[int, Field(ge=1, le=512)] = Field(
        8, description="padding=longest: batch lengths are rounded up to a multiple of this."
    )
    buckets: list[Annotated[int, Field(ge=1)]] | None = Field(
        None,
        description="padding=buckets: the batch lengths allowed (default: max_length/4, /2, 3/4 "
        "and max_length).",
    )
    group_by_length: bool = Field(
        False,
        description="Batch rows of similar length together (like transformers' group_by_length): "
        "each epoch's seeded order is cut into groups of 50 batches, each sorted by length. "
        "Less padding per batch; the order stays a function of the seed and the epoch.",
    )
    packing: bool = Field(
        True, description="causal-lm: concatenate texts and cut into max_length blocks."
    )
    shuffle: bool = Field(True, description="Shuffle the training order each epoch (seeded).")
    max_train_samples: PositiveInt | None = Field(
        None, description="Use at most this many train rows."
    )
    max_eval_samples: PositiveInt | None = Field(
        None, description="Use at most this many eval rows."
    )
    streaming: bool = Field(
        False,
        description="Read, shuffle and tokenize the train rows as they stream, never storing "
        "them (datasets' IterableDataset): for data that should not be materialised. Needs "
        "training.max_steps, data.eval (not eval_fraction), data.label_names for labelled tasks.",
    )
    shuffle_buffer: PositiveInt = Field(
        10000,
        description="data.streaming: rows in the shuffle buffer (a bounded shuffle, seeded).",
    )
    num_proc: PositiveInt = Field(
        1,
        description="Processes that tokenize (datasets.map's num_proc) for tasks that tokenize "
        "row by row (classification, token classification, seq2seq); the tokens are the same.",
    )

    @model_validator(mode="after")
    def _buckets_fit(self) -> DataSection:
        if self.buckets is not None and self.padding != "buckets":
            raise ValueError("data.buckets applies to data.padding=buckets")
        too_long = [b for b in self.buckets or [] if b > self.max_length]
        if too_long:
            raise ValueError(f"data.buckets {too_long} exceed data.max_length={self.max_length}")
        return self
