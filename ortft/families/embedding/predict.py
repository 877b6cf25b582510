"""``ortft predict`` for a model that embeds: one sentence embedding per input text, or, with
``--query``, the inputs (passages) ranked by cosine similarity to the query.

What embeds (``embeds``): an ONNX export whose export.json lists a ``sentence_embedding``
output (``ortft export`` of an encoder without a head, task feature-extraction, or of a
sentence-embedding run); a run dir or saved model whose task (its recipe.yaml) predicts
``embedding`` (a sentence-embedding run's ``final/``); an encoder without a head that no recipe
describes (``BertModel``; a sentence-transformers folder such as the quickstart's MiniLM), as
``ortft export`` treats it.

How: the texts (lowercased when the pooling says ``do_lower_case``) in batches padded to their
longest, truncated at ``--max-length``, else where sentence-transformers truncates
(``max_seq_length``), else at the length the run trained with, else at min(512, the model's
position limit). An ONNX export runs ``model.onnx`` and takes its ``sentence_embedding`` (the
pooling is in the graph; export.json's ``pooling`` gives the length and lowercasing). PyTorch
loads the folder with ``AutoModel`` and pools its hidden states with the folder's
sentence-transformers files (``pooling.read``) through the export's ``graphs.Pooled``:
the function the export is checked against, so both runtimes give the same vectors (within
the export's parity tolerance), and ``SentenceTransformer(folder).encode`` gives them too
(tests/test_st_layout.py).

Output, in input order: ``{"index", "embedding"}``, each value the shortest decimal that reads
back as the same float32 (a plain line: the vector alone, as a JSON list). With ``--query``:
``{"rank", "score", "index", "text"}``, best first (ties in input order), ``score`` the cosine
similarity; ``--top-k N`` keeps the first N.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ortft.core.errors import InputError
from ortft.core.reports import Prediction
from ortft.export import deploy
from ortft.families.embedding.pooling import Pooling

EMBEDDING = "sentence_embedding"  # the export's output (graphs.OUTPUTS)
EXPORT_JSON = "export.json"
MODEL = "model.onnx"
FALLBACK_LENGTH = 512  # no length recorded anywhere: what predict truncates other tasks at


@dataclass
class Embedder:
    """A model that turns token ids into one vector per row."""

    runtime: str  # "pytorch" or "onnxruntime"
    path: Path
    tokenizer: Any
    pooling: Pooling  # how it pools, and where it truncates / whether it lowercases
    max_length: int
    vectors: Callable[[np.ndarray, np.ndarray], np.ndarray]  # (ids, mask) -> [batch, hidden]

    def embed(self, texts: list[str], batch_size: int) -> np.ndarray:
        """float32 [len(texts), hidden]."""
        if self.pooling.lowercase:  # sentence_bert_config.json's do_lower_case
            texts = [t.lower() for t in texts]
        out = []
        for start in range(0, len(texts), batch_size):
            enc = self.tokenizer(
                texts[start : start + batch_size],
                max_length=self.max_length,
                truncation=True,
                padding=True,
                return_tensors="np",
            )
            ids, mask = enc["input_ids"].astype(np.int64), enc["attention_mask"].astype(np.int64)
            out.append(np.asarray(self.vectors(ids, mask), dtype=np.float32))
        return np.concatenate(out)


def model_folder(source: Path) -> tuple[Path, Path | None]:
    """(the model folder, its run dir), as ``ortft.inference.evaluate.open_model`` resolves them."""
    if (source / "final" / "config.json").exists():
        return source / "final", source
    if (source.parent / "summary.json").exists():
        return source, source.parent
    return source, None


def _export_json(folder: Path) -> dict[str, Any]:
    try:
        report = json.loads((folder / EXPORT_JSON).read_text())
    except (OSError, ValueError):
        return {}
    return report if isinstance(report, dict) else {}


def recipe_of(folder: Path, run: Path | None) -> Path | None:
    candidates = [folder / "recipe.yaml"] + ([run / "final" / "recipe.yaml"] if run else [])
    return next((p for p in candidates if p.exists()), None)


def _config(folder: Path) -> Any:
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(folder)
    except (OSError, ValueError) as err:
        raise InputError(f"{folder}: cannot load config.json ({err})") from None


def embeds(source: Path) -> bool:
    """Whether ``source`` (a run dir, a model folder or an ONNX export) gives embeddings."""
    folder, run = model_folder(Path(source))
    if (folder / MODEL).exists():
        return EMBEDDING in (_export_json(folder).get("outputs") or [])
    if not (folder / "config.json").exists():
        return False
    recipe = recipe_of(folder, run)
    if recipe is not None:
        from ortft import tasks
        from ortft.recipe.task import read_task
        from ortft.tasks import traits

        options = read_task(recipe)
        if options is not None:  # the run's own task decides (a masked-lm BERT does not embed)
            return traits.predicts(tasks.get(options.name, options)) == "embedding"
    from ortft.families.embedding import graphs

    return graphs.bare_encoder(_config(folder))


def _trained_length(recipe: Path | None) -> int | None:
    """The recipe's ``data.max_length`` (a run's final/recipe.yaml holds the resolved one)."""
    import yaml

    if recipe is None:
        return None
    try:
        raw = yaml.safe_load(recipe.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return None
    data = raw.get("data") if isinstance(raw, dict) else None
    length = data.get("max_length") if isinstance(data, dict) else None
    return length if isinstance(length, int) and length > 0 else None


def _tokenizer(folder: Path) -> Any:
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(folder)
    except (OSError, ValueError) as err:
        raise InputError(f"{folder}: cannot load the tokenizer ({err})") from None
    if tok.pad_token is None:  # padding a batch needs one; the mask keeps it out of the pool
        tok.pad_token = tok.eos_token or tok.unk_token
    return tok


def _onnx(folder: Path) -> tuple[Pooling, Callable[[np.ndarray, np.ndarray], np.ndarray]]:
    import onnxruntime as ort

    recorded = _export_json(folder).get("pooling") or {}
    keys = ("mode", "normalize", "max_seq_length", "lowercase", "source")
    pooling = Pooling(**{k: recorded[k] for k in keys if k in recorded})
    session = ort.InferenceSession(str(folder / MODEL), providers=["CPUExecutionProvider"])

    def vectors(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return session.run([EMBEDDING], {"input_ids": ids, "attention_mask": mask})[0]

    return pooling, vectors


def _pytorch(folder: Path) -> tuple[Pooling, Callable[[np.ndarray, np.ndarray], np.ndarray]]:
    import torch
    from transformers import AutoModel

    from ortft.families.embedding import graphs
    from ortft.families.embedding import pooling as pooling_files

    pooling = pooling_files.read(folder)
    try:
        model = AutoModel.from_pretrained(folder).eval()
    except (OSError, ValueError) as err:
        raise InputError(f"{folder}: cannot load the model ({err})") from None
    pooled = graphs.Pooled(model, pooling).eval()

    def vectors(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return pooled(torch.from_numpy(ids), torch.from_numpy(mask))[1].float().numpy()

    return pooling, vectors


def open_embedder(source: Path, max_length: int | None = None) -> Embedder:
    """The model ``source`` names, ready to embed (``embeds(source)`` said it does)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # stdout/stderr stay ortft's
    folder, run = model_folder(Path(source))
    onnx = (folder / MODEL).exists()
    pooling, vectors = _onnx(folder) if onnx else _pytorch(folder)
    config = _config(folder)
    limit = deploy.model_limit(config) or FALLBACK_LENGTH
    length = max_length or pooling.max_seq_length or _trained_length(recipe_of(folder, run))
    return Embedder(
        runtime="onnxruntime" if onnx else "pytorch",
        path=folder,
        tokenizer=_tokenizer(folder),
        pooling=pooling,
        max_length=length or min(FALLBACK_LENGTH, limit),
        vectors=vectors,
    )


def _floats(vector: np.ndarray) -> list[float]:
    """Each value as the shortest decimal that reads back as the same float32 (numpy's repr)."""
    return [float(str(v)) for v in vector.astype(np.float32)]


def unit(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def rank(
    model: Embedder, texts: list[str], query: str, top_k: int | None, batch_size: int
) -> Iterator[Prediction]:
    """The texts by cosine similarity to ``query``, best first (ties: input order)."""
    scores = unit(model.embed(texts, batch_size)) @ unit(model.embed([query], 1))[0]
    order = np.argsort(-scores, kind="stable")[:top_k]
    for n, i in enumerate(order, 1):
        yield {"rank": n, "score": float(scores[i]), "index": int(i), "text": texts[i]}


def run(
    source: Path,
    texts: list[str],
    where: str,
    *,
    query: str | None = None,
    top_k: int | None = None,
    max_length: int | None = None,
    batch_size: int = 16,
) -> Iterator[Prediction]:
    """One embedding per text, or (``query``) the texts ranked; ``where`` names the input."""
    if not texts:
        raise InputError(f"{where}: no texts to embed (give one per line, or JSONL with 'text')")
    if top_k is not None and query is None:
        raise InputError("--top-k ranks passages: give --query TEXT with it")
    if query is not None and not query.strip():
        raise InputError("--query: empty text")
    model = open_embedder(source, max_length)
    if query is not None:
        return rank(model, texts, query, top_k, batch_size)
    vectors = model.embed(texts, batch_size)
    return ({"index": i, "embedding": _floats(v)} for i, v in enumerate(vectors))
