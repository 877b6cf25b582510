"""``ortft predict`` for image-text-to-text: the answer to each row of a JSONL file.

Input (``--input``): a JSONL file, one row a line (blank lines skipped), each with the image
file (``data.image_column`` of the recipe the model was trained with, ``image`` where none is
known; relative to the file's folder) and either the question (``task.question_column``) or a
conversation (``task.messages_column``; a last assistant turn, if any, is answered again).
Every row is read and its image decoded before anything is printed, so a bad row stops the
command with one line, ``rows.jsonl:3: ...``, exit 2, and no answers.

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

IMAGE_COLUMN = "image"  # data.image_column's default: a model without its training recipe


def generate(
    model: Any, processor: Any, ids: np.ndarray, vision: dict[str, np.ndarray], max_new_tokens: int
) -> list[tuple[str, int]]:
    """(the answer, its new tokens) of each row of ``ids`` [batch, prompt] (prompts of one
    length: no padding) on its image's arrays ``vision`` (the architecture's
    ``archs.Arch.pixels``: LLaVA's ``pixel_values``, Idefics3's ``pixel_attention_mask`` too,
    Qwen2-VL's grid): transformers' ``generate``, greedy, or an export's graphs generating the
    same way (``exporting.OnnxVisionLanguage``)."""
    from ortft.families.vision_language import archs
    from ortft.families.vision_language.exporting import OnnxVisionLanguage

    if isinstance(model, OnnxVisionLanguage):
        seqs = model.sequences(np.asarray(ids), vision, max_new_tokens)
        return _answers(processor, seqs[:, np.asarray(ids).shape[1] :].tolist())
    import torch

    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    prompt = torch.as_tensor(np.asarray(ids, dtype=np.int64), device=device)
    given = archs.of(model).model_inputs(model, prompt.cpu(), vision)
    extra = {k: v.to(device) for k, v in given.items()}
    with torch.no_grad():
        out = model.generate(
            input_ids=prompt,
            attention_mask=torch.ones_like(prompt),
            **extra,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            num_beams=1,
        )
    model.train(was_training)
    return _answers(processor, out[:, prompt.shape[1] :].cpu().tolist())


def _answers(processor: Any, rows: list[list[int]]) -> list[tuple[str, int]]:
    """Each row of new tokens up to the end-of-sequence, decoded, and its length."""
    tok, answers = processor.tokenizer, []
    for row in rows:
        new = row[: row.index(tok.eos_token_id)] if tok.eos_token_id in row else row
        answers.append((tok.decode(new, skip_special_tokens=True).strip(), len(new)))
    return answers


def by_length(prompts: list[np.ndarray]) -> dict[int, list[int]]:
    """The indices of ``prompts`` grouped by length, in order: each group generates as one
    batch without padding (the digits' questions: two groups)."""
    groups: dict[int, list[int]] = {}
    for i, p in enumerate(prompts):
        groups.setdefault(len(p), []).append(i)
    return groups


def image_column(m: Any) -> str:
    """The image column the model was trained on (its recipe's ``data.image_column``)."""
    from ortft.inference.evaluate import training_recipe

    loaded = training_recipe(m)
    return IMAGE_COLUMN if loaded is None else loaded.recipe.data.image_column


def _rows(
    task: Any, input_path: str, column: str = IMAGE_COLUMN
) -> list[tuple[int, str, dict[str, Any]]]:
    """(line, image path as given, the row with its path resolved) of each JSONL line; the
    image path in ``column``."""
    path = Path(input_path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"--input {input_path}: cannot read it ({err})") from None
    out = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as err:
            raise InputError(f"{input_path}:{n}: not a JSON object ({err})") from None
        if not isinstance(row, dict) or not isinstance(row.get(column), str):
            raise InputError(
                f"{input_path}:{n}: needs '{column}' (data.image_column), the image file's path"
            )
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


def run(
    task: Any, m: Any, input_path: str, batch_size: int, max_new_tokens: int
) -> Iterator[Prediction]:
    """One answer per row; every row read and checked first."""
    from ortft.families.vision_language import archs

    processor = m.tokenizer
    arch = archs.of_processor(processor)
    task.bind(processor)
    column = image_column(m)
    rows = _rows(task, input_path, column)
    prompts = []
    for n, _, row in rows:
        try:
            prompts.append(task.prompt_ids(row, n - 1, row[column]))
        except InputError as err:  # "row N: ..." as training says it
            raise InputError(f"{input_path}:{n}: {str(err).split(': ', 1)[-1]}") from None
    out: dict[int, Prediction] = {}
    for lo in range(0, len(rows), batch_size):  # batch_size rows decoded at a time
        chunk = list(range(lo, min(len(rows), lo + batch_size)))
        for group in by_length([np.asarray(prompts[k]) for k in chunk]).values():
            idx = [chunk[g] for g in group]
            decoded = [images.load(rows[k][2][column]) for k in idx]
            vision = arch.pixels(processor, decoded)
            ids = np.stack([np.asarray(prompts[k]) for k in idx])
            answers = generate(m._model, processor, ids, vision, max_new_tokens)
            for k, (text, new) in zip(idx, answers, strict=True):
                out[k] = {"index": k, "input": rows[k][1], "generated": text, "new_tokens": new}
        yield from (out.pop(k) for k in chunk)
