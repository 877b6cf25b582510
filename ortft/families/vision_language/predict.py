"""``ortft predict`` for image-text-to-text: the answer to each row of a JSONL file.

Input (``--input``): a JSONL file, one row a line (blank lines skipped), each with the image
file (``image``, relative to the file's folder) and either the
question (``task.question_column``) or a conversation (``task.messages_column``; a last
assistant turn, if any, is answered again). Every row is read and its image decoded before
anything is printed, so a bad row stops the command with one line, ``rows.jsonl:3: ...``,
exit 2, and no answers.

Output, one object per row in input order: ``index``, ``input`` (the image path as the row
gives it), ``generated`` (the greedy answer, special tokens left out) and ``new_tokens``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ortft.core.errors import InputError
from ortft.core.reports import Prediction
from ortft.data import images

IMAGE_COLUMN = "image"


def answer(
    model: Any, processor: Any, ids: np.ndarray, pixel_values: np.ndarray, max_new_tokens: int
) -> str:
    """The greedy answer after the prompt ``ids`` (one row) on one image's ``pixel_values``."""
    return generate(model, processor, ids, pixel_values, max_new_tokens)[0]


def generate(
    model: Any, processor: Any, ids: np.ndarray, pixel_values: np.ndarray, max_new_tokens: int
) -> tuple[str, int]:
    """(the text, its new tokens) that transformers' ``generate`` gives, greedy."""
    import torch

    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    prompt = torch.as_tensor(np.asarray(ids, dtype=np.int64)[None], device=device)
    with torch.no_grad():
        out = model.generate(
            input_ids=prompt,
            attention_mask=torch.ones_like(prompt),
            pixel_values=torch.as_tensor(pixel_values, device=device),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            num_beams=1,
        )
    model.train(was_training)
    new = out[0, prompt.shape[1] :].cpu().tolist()
    text = processor.tokenizer.decode(new, skip_special_tokens=True)
    eos = processor.tokenizer.eos_token_id
    return text.strip(), len([t for t in new if t != eos])


def _rows(task: Any, input_path: str) -> list[tuple[int, str, dict[str, Any]]]:
    """(line, image path as given, the row with its path resolved) of each JSONL line."""
    path = Path(input_path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"--input {input_path}: cannot read it ({err})") from None
    column = IMAGE_COLUMN
    out = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as err:
            raise InputError(f"{input_path}:{n}: not a JSON object ({err})") from None
        if not isinstance(row, dict) or not isinstance(row.get(column), str):
            raise InputError(f"{input_path}:{n}: needs '{column}', the image file's path")
        shown = row[column]
        row = {**row, column: str(path.parent / shown)}
        try:
            images.check(row[column])
        except images.BadImage as err:
            raise InputError(f"{input_path}:{n}: {shown}: {err}") from None
        out.append((n, shown, row))
    if not out:
        raise InputError(f"--input {input_path}: no rows")
    return out


def run(task: Any, m: Any, input_path: str, max_new_tokens: int) -> Iterator[Prediction]:
    """One answer per row; every row read and checked first."""
    processor = m.tokenizer
    task.bind(processor)
    rows = _rows(task, input_path)
    prompts = []
    for n, _, row in rows:
        try:
            prompts.append(task.prompt_ids(row, n - 1))
        except InputError as err:  # "row N: ..." as training says it
            raise InputError(f"{input_path}:{n}: {str(err).split(': ', 1)[-1]}") from None
    for index, ((_, shown, row), ids) in enumerate(zip(rows, prompts, strict=True)):
        image = images.load(row[IMAGE_COLUMN])
        pixels = images.pixel_values([image], processor.image_processor)
        text, new = generate(m._model, processor, np.asarray(ids), pixels, max_new_tokens)
        yield {"index": index, "input": shown, "generated": text, "new_tokens": new}
