"""``ortft predict`` for the text tasks whose output is not a label: token classification's
tags, question answering's answers, masked LM's filled masks (a sequence classifier's label is
the core's ``ortft.inference.predict.classify``: a model no recipe describes may get it too).
Each reads the input lines (``ortft.inference.predict.read_inputs``) itself and cuts them to
``input_length``; see ``ortft.inference.predict`` for what each result holds."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from ortft.core.errors import InputError
from ortft.core.reports import Prediction
from ortft.families.text.spans import best_span, context_char_spans
from ortft.inference.evaluate import SavedModel
from ortft.inference.predict import _chunks, _field, _softmax, input_length

TOP_K = 5  # fill-mask candidates per mask, as the transformers fill-mask pipeline's default


def tags(
    m: SavedModel, inputs: list[tuple[str, dict[str, Any]]], max_length: int | None, batch_size: int
) -> Iterator[Prediction]:
    """Each input's words (its tokens list, else its text's) with their tags."""
    length = input_length(m, max_length)
    return tag(m, [_words(m, w, o) for w, o in inputs], length, batch_size)


def answers(
    m: SavedModel, inputs: list[tuple[str, dict[str, Any]]], max_length: int | None, batch_size: int
) -> Iterator[Prediction]:
    """Each JSON line's answer: a span of its context (the task's two columns)."""
    length = input_length(m, max_length)
    q, c = m.spec.question_column, m.spec.context_column
    for where, o in inputs:
        if q not in o and c not in o:  # a plain line
            raise InputError(f'{where}: give JSON lines {{"{q}": ..., "{c}": ...}}')
    asked = [(_field(o, q, w), _field(o, c, w)) for w, o in inputs]
    return answer(m, asked, length, batch_size)


def filled(
    m: SavedModel, inputs: list[tuple[str, dict[str, Any]]], max_length: int | None, batch_size: int
) -> Iterator[Prediction]:
    """Each text with its mask tokens filled (a text without one is an error naming it)."""
    length = input_length(m, max_length)
    texts = [_field(o, "text", w) for w, o in inputs]
    mask = m.tokenizer.mask_token
    for (where, _), text in zip(inputs, texts, strict=True):
        if mask not in text:
            raise InputError(f"{where}: no {mask} in the text (masked-lm predict fills them)")
    return fill_mask(m, texts, length, batch_size)


def tag(
    m: SavedModel, words: list[list[str]], max_length: int, batch_size: int
) -> Iterator[Prediction]:
    labels = m.labels() or []
    for start, chunk in _chunks(words, batch_size):
        enc = m.tokenizer(
            chunk,
            is_split_into_words=True,
            max_length=max_length,
            truncation=True,
            padding=True,
            return_tensors="np",
        )
        best = m.logits(enc["input_ids"], enc["attention_mask"]).argmax(-1)
        for i, row in enumerate(chunk):
            tags: list[str | None] = [None] * len(row)  # a word truncated away keeps None
            for pos, word in enumerate(enc.word_ids(i)):
                if word is not None and tags[word] is None:  # the word's first sub-token
                    tags[word] = labels[int(best[i, pos])]
            yield {"index": start + i, "tokens": row, "tags": tags}


def answer(
    m: SavedModel, pairs: list[tuple[str, str]], max_length: int, batch_size: int
) -> Iterator[Prediction]:
    for start, chunk in _chunks(pairs, batch_size):
        questions, contexts = [q for q, _ in chunk], [c for _, c in chunk]
        enc = m.spec.tokenize(questions, contexts, m.tokenizer, max_length)
        ids = np.asarray(enc["input_ids"], dtype=np.int64)
        mask = np.asarray(enc["attention_mask"], dtype=np.int64)
        logits = m.logits(ids, mask)
        for i, context in enumerate(contexts):
            chars = context_char_spans(enc, i)
            span = best_span(logits[i, 0], logits[i, 1], chars[:, 0] >= 0)
            out: Prediction = {"index": start + i, "answer": "", "start": None, "end": None}
            if span is not None:  # else the context was truncated away entirely
                # padding is no position: the score does not depend on the padded length
                real = np.where(mask[i] == 1, logits[i].astype(np.float64), -np.inf)
                (s, e), p = span, _softmax(real)
                first, last = int(chars[s, 0]), int(chars[e, 1])
                out["answer"], out["start"], out["end"] = context[first:last], first, last
                out["score"] = float(p[0, s] * p[1, e])
            yield out


def fill_mask(
    m: SavedModel, texts: list[str], max_length: int, batch_size: int
) -> Iterator[Prediction]:
    tok = m.tokenizer
    for start, chunk in _chunks(texts, batch_size):
        enc = tok(chunk, max_length=max_length, truncation=True, padding=True, return_tensors="np")
        ids = enc["input_ids"].astype(np.int64)
        logits = m.logits(ids, enc["attention_mask"].astype(np.int64))
        for i in range(len(chunk)):
            filled, masks = ids[i].copy(), []
            for pos in np.flatnonzero(ids[i] == tok.mask_token_id):
                p = _softmax(logits[i, pos].astype(np.float64))
                top = np.argsort(-p, kind="stable")[:TOP_K]
                filled[pos] = top[0]
                cands = [{"token": tok.decode([int(t)]).strip(), "score": float(p[t])} for t in top]
                masks.append({**cands[0], "candidates": cands})
            text = tok.decode(filled[enc["attention_mask"][i] == 1], skip_special_tokens=True)
            yield {"index": start + i, "filled": text, "masks": masks}


def _words(m: SavedModel, where: str, obj: dict[str, Any]) -> list[str]:
    column = m.spec.tokens_column
    words = obj.get(column)
    if words is None:
        return _field(obj, "text", where).split()
    if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
        raise InputError(f"{where}: '{column}' must be a list of strings")
    return words
