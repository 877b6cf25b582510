"""``ortft predict``: run a trained model (PyTorch ``final/`` or its ONNX export) on texts.

Input: one text per line, or JSONL whose objects carry a ``text`` field (a line that starts
with ``{`` is read as JSON); blank lines are skipped. Output, one line per input, in order:
classification gives the label with softmax scores, a decoder task (causal LM, instruction) the
greedy continuation (an instruction run's input is formatted as a prompt, as in training).
Greedy decoding re-runs the whole sequence for each new token (no KV cache), the same loop
for PyTorch and ONNX Runtime, so both give the same text.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from ortft.errors import InputError
from ortft.inference.evaluate import SavedModel, open_model, training_recipe


def read_texts(stream: TextIO, name: str) -> list[str]:
    texts = []
    for n, line in enumerate(stream, 1):
        line = line.rstrip("\n")
        if not line.strip():
            continue
        if line.lstrip().startswith("{"):
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as err:
                raise InputError(f"{name}:{n}: not valid JSON ({err.msg})") from None
            if not isinstance(obj.get("text"), str):
                raise InputError(f"{name}:{n}: a JSON line needs a string field 'text'")
            line = obj["text"]
        texts.append(line)
    return texts


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def classify(
    m: SavedModel, texts: list[str], max_length: int, batch_size: int
) -> Iterator[dict[str, Any]]:
    labels = m.labels() or []
    for start in range(0, len(texts), batch_size):
        chunk = texts[start : start + batch_size]
        enc = m.tokenizer(
            chunk, max_length=max_length, truncation=True, padding=True, return_tensors="np"
        )
        probs = _softmax(m.logits(enc["input_ids"], enc["attention_mask"]).astype(np.float64))
        for i, p in enumerate(probs):
            best = int(p.argmax())
            yield {
                "index": start + i,
                "label": labels[best],
                "score": float(p[best]),
                "scores": {name: float(v) for name, v in zip(labels, p, strict=True)},
            }


def generate(m: SavedModel, texts: list[str], max_new_tokens: int) -> Iterator[dict[str, Any]]:
    tok = m.tokenizer
    limit = m.max_positions() or 1024
    eos = tok.eos_token_id
    for index, text in enumerate(texts):
        prompt = m.spec.prompt(text, tok)
        ids = tok(prompt, add_special_tokens=False)["input_ids"] or [eos if eos is not None else 0]
        ids = ids[-max(1, limit - max_new_tokens) :]  # keep the prompt's end within the positions
        new: list[int] = []
        for _ in range(max_new_tokens):
            seq = np.asarray([ids + new], dtype=np.int64)
            next_id = int(m.logits(seq, np.ones_like(seq))[0, -1].argmax())
            if next_id == eos:
                break
            new.append(next_id)
        yield {
            "index": index,
            "generated": tok.decode(new, skip_special_tokens=True),
            "new_tokens": len(new),
        }


def run(
    source: Path,
    input_path: str,
    *,
    max_new_tokens: int = 32,
    max_length: int | None = None,
    batch_size: int = 16,
) -> Iterator[dict[str, Any]]:
    """One result dict per input text."""
    m = open_model(source)
    if m.spec.export_kind != "decoder" and not (
        m.spec.export_kind == "encoder" and m.spec.needs_labels
    ):
        raise InputError(
            f"{source}: ortft predict classifies texts or continues them; it has no output "
            f"for {m.task} (use ortft eval to score it)"
        )
    if input_path == "-":
        texts = read_texts(sys.stdin, "<stdin>")
    else:
        path = Path(input_path)
        if not path.is_file():
            raise InputError(f"{path}: input file not found")
        with open(path, encoding="utf-8") as fh:
            texts = read_texts(fh, str(path))
    if m.spec.export_kind == "decoder":
        return generate(m, texts, max_new_tokens)
    if max_length is None:  # the length the model was trained with, else its own limit
        loaded = training_recipe(m)
        max_length = loaded.recipe.data.max_length if loaded else min(512, m.max_positions() or 512)
    return classify(m, texts, max_length, batch_size)


def format_line(result: dict[str, Any]) -> str:
    """The plain (non --json) line: label and score, or the generated text on one line."""
    if "label" in result:
        return f"{result['label']}\t{result['score']:.4f}"
    return result["generated"].replace("\n", "\\n")
