"""``ortft predict``: run a trained model (PyTorch ``final/`` or its ONNX export) on inputs.

Input: one text per line, or JSONL objects (a line that starts with ``{``); blank lines are
skipped. A JSON line gives its ``text`` field, token classification also takes a ``tokens``
list (the task's tokens column), question answering needs ``question`` and ``context`` fields
(the task's columns), a sentence-pair classifier ``text`` and ``text_pair`` (or its training
columns; ``ortft.inference.pairs``). Output, one line per input, in order; what a task gives is its
``traits.Predicts``:

- label (sequence classification): the label, with softmax scores over all labels;
- tags (token classification): one tag per word (words: whitespace-separated, or the tokens
  list), from the word's first sub-token as in training; a word cut off by max_length: null;
- answer (question answering): the best span of the context (as eval picks it), its character
  offsets and score (start probability x end probability, over the unpadded positions);
- fill-mask (masked LM): each mask token's best token with its top-5 candidates, and the text
  with the masks filled;
  (tags, answer and fill-mask: the text family answers each line itself, as generation does:
  ``ortft.tasks.protocols.PredictsLines``; ``ortft.families.text.predict``)
- reward (reward model; ``ortft.families.preference.reward``): a pair row's two rewards, their
  margin and the preferred response (chosen, rejected, or tie within 1e-4), or one response's
  reward (``{prompt, response}``, ``{messages}``, or a plain line scored as it is);
- generate (causal LM, instruction, seq2seq): a family that answers each line itself
  (``ortft.tasks.protocols.PredictsLines``; ``ortft.families.generation.predict``): the text
  ``generate`` gives with the model's generation config, on PyTorch or on the export (the same
  search and logits processors: ``ortft.export.generation``);
- a family that reads files of its own (``ortft.tasks.protocols.PredictsFiles``) gets
  ``--input`` (a list of paths, one per line, or a folder: ``ortft.inference.input_files``) and
  answers each file itself: image classification's label, softmax scores and top 5
  (image-label), speech recognition's transcripts;
- embedding (a sentence-embedding run, an embedding export, an encoder without a head): each
  text's sentence embedding, or with ``--query`` the texts ranked by cosine similarity to it,
  from the family that embeds (``ortft.tasks.protocols.EmbedsTexts``, which also says what
  counts as embedding).

``--prompt`` with ``-o out.png`` draws instead (``draw``): the family that draws
(``ortft.tasks.protocols.DrawsPrompts``, text-to-image's) reads the folder itself.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO, cast

import numpy as np

from ortft.core.errors import InputError
from ortft.core.reports import Drawing, Prediction
from ortft.inference import pairs
from ortft.inference.evaluate import SavedModel, open_model, training_recipe
from ortft.tasks import protocols, traits


def read_inputs(stream: TextIO, name: str) -> list[tuple[str, dict[str, Any]]]:
    """(where, object) per non-blank line: a plain line is ``{"text": line}``."""
    inputs = []
    for n, line in enumerate(stream, 1):
        line = line.rstrip("\n")
        if not line.strip():
            continue
        obj: Any = {"text": line}
        if line.lstrip().startswith("{"):
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as err:
                raise InputError(f"{name}:{n}: not valid JSON ({err.msg})") from None
            if not isinstance(obj, dict):
                raise InputError(f"{name}:{n}: a JSON line must be an object")
        inputs.append((f"{name}:{n}", obj))
    return inputs


def _field(obj: dict[str, Any], key: str, where: str) -> Any:
    if not isinstance(obj.get(key), str):
        raise InputError(f"{where}: a JSON line needs a string field '{key}'")
    return obj[key]


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _chunks(items: list[Any], size: int) -> Iterator[tuple[int, list[Any]]]:
    for start in range(0, len(items), size):
        yield start, items[start : start + size]


def classify(
    m: SavedModel,
    texts: list[str],
    max_length: int,
    batch_size: int,
    second: list[str] | None = None,
) -> Iterator[Prediction]:
    """Each text's label and scores; ``second``: a pair model's second texts, encoded with the
    first as in training, their token_type_ids fed where the model takes them."""
    labels = m.labels() or []
    for start, chunk in _chunks(texts, batch_size):
        pair = second[start : start + batch_size] if second is not None else None
        enc = m.tokenizer(
            chunk, pair, max_length=max_length, truncation=True, padding=True, return_tensors="np"
        )
        types = enc.get("token_type_ids") if pair is not None else None
        logits = m.logits(enc["input_ids"], enc["attention_mask"], token_type_ids=types)
        probs = _softmax(logits.astype(np.float64))
        for i, p in enumerate(probs):
            best = int(p.argmax())
            yield {
                "index": start + i,
                "label": labels[best],
                "score": float(p[best]),
                "scores": {name: float(v) for name, v in zip(labels, p, strict=True)},
            }


def input_texts(inputs: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """Each input's text (a JSON line without a string ``text`` field is an error naming it)."""
    return [_field(o, "text", w) for w, o in inputs]


def input_length(m: SavedModel, given: int | None) -> int:
    """The tokens an input is cut to: ``given`` (``--max-length``), else the length the model
    was trained with, else its own limit (at most 512)."""
    if given is not None:
        return given
    loaded = training_recipe(m)
    return loaded.recipe.data.max_length if loaded else min(512, m.max_positions() or 512)


def _read(input_path: str) -> list[tuple[str, dict[str, Any]]]:
    if input_path == "-":
        return read_inputs(sys.stdin, "<stdin>")
    path = Path(input_path)
    if not path.is_file():
        raise InputError(f"{path}: input file not found")
    with open(path, encoding="utf-8") as fh:
        return read_inputs(fh, str(path))


def draw(source: Path, options: dict[str, Any], output: Path) -> Drawing:
    """``ortft predict --prompt -o``: one image of ``options["prompt"]`` into ``output``, drawn
    by the first registered family that draws (``protocols.DrawsPrompts``); what was drawn."""
    from ortft import tasks

    drawers = cast("list[protocols.DrawsPrompts]", tasks.implementing(protocols.DrawsPrompts))
    if not drawers:
        raise InputError("--prompt: no registered task draws images")
    return drawers[0].draw(source, options, output)


def run(
    source: Path,
    input_path: str,
    *,
    max_new_tokens: int = 32,
    max_length: int | None = None,
    batch_size: int = 16,
    query: str | None = None,
    top_k: int | None = None,
) -> Iterator[Prediction]:
    """One result dict per input (``query``, ``top_k``: rank them, for a model that embeds)."""
    from ortft import tasks

    embedder = tasks.embedder(source)
    if embedder is not None:  # before open_model: an export without a task
        where = "<stdin>" if input_path == "-" else input_path
        texts = [_field(o, "text", w) for w, o in _read(input_path)]
        return embedder.predict_embeddings(
            source,
            texts,
            where,
            query=query,
            top_k=top_k,
            max_length=max_length,
            batch_size=batch_size,
        )
    m = open_model(source)
    if query is not None or top_k is not None:
        raise InputError(
            f"{source}: --query and --top-k rank texts by embedding, and {m.task} does not "
            "embed (a sentence-embedding run or an embedding export does)"
        )
    kind = traits.predicts(m.spec)
    if kind is None:
        raise InputError(f"{source}: ortft predict has no output for {m.task} (use ortft eval)")
    if isinstance(m.spec, protocols.PredictsFiles):  # the family reads its own files
        return m.spec.predict_files(m, input_path, batch_size, max_new_tokens)
    inputs = _read(input_path)
    if isinstance(m.spec, protocols.PredictsLines):  # the family answers each line
        return m.spec.predict_lines(m, inputs, max_new_tokens, max_length, batch_size)
    max_length = input_length(m, max_length)
    texts, second = pairs.texts(inputs, m.text_pair)  # a pair model's inputs give both texts
    return classify(m, texts, max_length, batch_size, second)


def format_line(result: Prediction) -> str:
    """The plain (non --json) line: label and score (an image's: after its path), word/TAG
    pairs, the answer and its score, the filled text, the generated text, an embedding, or a
    ranked text, on one line."""
    if "embedding" in result:  # the vector as a JSON list
        return json.dumps(result["embedding"])
    if "rank" in result:  # a text ranked by its similarity to --query
        return f"{result['rank']}\t{result['score']:.4f}\t{result['text']}"
    if "seconds" in result:  # a transcript: after its file's path
        return f"{result['input']}\t{result['text']}"
    if "top_k" in result:
        return f"{result['input']}\t{result['label']}\t{result['score']:.4f}"
    if "label" in result:
        return f"{result['label']}\t{result['score']:.4f}"
    if "reward" in result:
        return f"{result['reward']:.4f}"
    if "preferred" in result:  # a reward model's pair
        rewards = f"{result['reward_chosen']:.4f}\t{result['reward_rejected']:.4f}"
        return f"{result['preferred']}\t{rewards}"
    if "tags" in result:
        return " ".join(
            f"{w}/{t or '-'}" for w, t in zip(result["tokens"], result["tags"], strict=True)
        )
    if "answer" in result:
        return f"{result['answer']}\t{result.get('score', 0.0):.4f}"
    text = result["filled"] if "filled" in result else result["generated"]
    return text.replace("\n", "\\n")
