"""``ortft predict`` for the generation tasks: the text ``generate`` gives for each input line.

What both runtimes generate with is the model's generation config (PyTorch: the model's own;
ONNX: the export's ``generation_config.json``: greedy or beam search, forced BOS/EOS,
no_repeat_ngram_size, min/max lengths, repetition_penalty, suppressed tokens; sampling off).
PyTorch runs ``model.generate``; an ONNX export the same search and logits processors
(``ortft.export.generation``). A decoder (causal-lm, instruction: its input formatted as a prompt,
as in training) with its KV cache (the default) runs the prompt once, then one token a step; a
graph without the cache re-runs the whole sequence for each new token
(``decoder_graph``). A seq2seq export runs the encoder once and the decoder with its cache.
Both runtimes give the same text (the export's generation check compares them with
``generate``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from ortft.core.errors import InputError
from ortft.core.reports import Prediction
from ortft.inference.evaluate import SavedModel


def _generation_config(m: SavedModel, max_new_tokens: int) -> Any:
    """What both runtimes generate with: the model's generation config (PyTorch: the model's
    own; ONNX: the export's generation_config.json), sampling off, ``max_new_tokens``."""
    from ortft.export import generation

    if m.runtime == "pytorch":
        gc = m._model.generation_config
    else:
        gc = generation.load(m.path, m.config)
        if bad := generation.unsupported(gc):
            raise InputError(
                f"{m.path / 'generation_config.json'}: ortft predict on ONNX does not apply "
                f"{', '.join(bad)} (PyTorch's generate would); unset it or predict on final/"
            )
    return generation.deterministic(gc, max_new_tokens=max_new_tokens)


def _torch_generate(m: SavedModel, gc: Any, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        out = m._model.generate(
            input_ids=torch.from_numpy(ids.astype(np.int64)),
            attention_mask=torch.from_numpy(mask.astype(np.int64)),
            generation_config=gc,
        )
    return out.numpy()


def _new_tokens(row: np.ndarray, eos: set[int]) -> list[int]:
    """The generated tokens up to (not with) the first eos; a finished row's padding dropped."""
    out: list[int] = []
    for t in row.tolist():
        if t in eos:
            break
        out.append(int(t))
    return out


def _eos(gc: Any) -> set[int]:
    return {int(e) for e in np.atleast_1d(gc.eos_token_id if gc.eos_token_id is not None else [])}


def decoder(m: SavedModel, texts: list[str], max_new_tokens: int) -> Iterator[Prediction]:
    """A decoder's continuation of each text, as ``generate`` gives it with the model's
    generation config (greedy or beam search, its logits processors)."""
    from ortft.export import generation, parity
    from ortft.families.generation.decoder_graph import CachedSteps, WholeSteps

    tok = m.tokenizer
    gc = _generation_config(m, max_new_tokens)
    cache = m.runtime == "onnxruntime" and bool(parity.empty_past(m._model, 1))
    limit = m.max_positions() or 1024
    eos = tok.eos_token_id
    for index, text in enumerate(texts):
        prompt = m.spec.prompt(text, tok)
        ids = tok(prompt, add_special_tokens=False)["input_ids"] or [eos if eos is not None else 0]
        ids = ids[-max(1, limit - max_new_tokens) :]  # keep the prompt's end within the positions
        x = np.asarray([ids], dtype=np.int64)
        if m.runtime == "pytorch":
            seq = _torch_generate(m, gc, x, np.ones_like(x))
        else:  # with the cache: the prompt once, then one token a step
            steps = CachedSteps(m._model) if cache else WholeSteps(m.logits)
            p = generation.plan(
                gc, len(ids), encoder_decoder=False, max_positions=m.max_positions()
            )
            seq = generation.generate(steps, x, p)[0]
        new = _new_tokens(seq[0, len(ids) :], _eos(gc))
        yield {
            "index": index,
            "generated": tok.decode(new, skip_special_tokens=True),
            "new_tokens": len(new),
        }


def seq2seq(
    m: SavedModel, texts: list[str], max_new_tokens: int, max_length: int, batch_size: int
) -> Iterator[Prediction]:
    """An encoder-decoder's output for each text, as ``generate`` gives it with the model's
    generation config: PyTorch's, or the export's encoder once and its decoder with the cache
    (``seq2seq_graphs.OnnxSeq2Seq.search``)."""
    tok = m.tokenizer
    special = set(tok.all_special_ids)
    gc = _generation_config(m, max_new_tokens)
    for start in range(0, len(texts), batch_size):
        chunk = texts[start : start + batch_size]
        enc = tok(chunk, max_length=max_length, truncation=True, padding=True, return_tensors="np")
        ids, mask = enc["input_ids"].astype(np.int64), enc["attention_mask"].astype(np.int64)
        if m.runtime == "pytorch":
            out = _torch_generate(m, gc, ids, mask)
        else:  # the encoder once, the decoder with its cache
            out = m._model.search(ids, mask, gc)[0]
        for i, row in enumerate(out):
            yield {
                "index": start + i,
                "generated": tok.decode(row, skip_special_tokens=True),
                "new_tokens": sum(int(t) not in special for t in row),
            }
