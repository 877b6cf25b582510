"""sentence-embedding: a bare encoder trained so that related texts get close vectors, with
in-batch negatives (sentence-transformers' MultipleNegativesRankingLoss); scored by retrieval.

Data: rows of (anchor, positive) pairs, or (anchor, positive, negative) triplets with
``task.negative_column`` (column names under ``task:``). Each text is tokenized on its own and
stored in its own arrays: ``input_ids`` / ``attention_mask`` (the anchor), ``positive_*`` and
``negative_*``, each cut to the batch's longest text of its own kind (``cut``), so a short
anchor is not padded to a passage's length; ``_length`` (a row's longest text) groups rows.

Loss: one model call per text kind (anchors, positives, negatives), all in one forward, so
ORTModule exports one graph that holds the encoder once per kind with its weights shared; in
eager PyTorch their words are looked up in the table once for all kinds (``lookup``); pooled as
``task.pooling`` says (``pooling``: auto reads
the model folder's modules.json, else mean). Each anchor's cosine similarity to every positive
and negative in the batch, times ``task.scale``, then cross-entropy against its own positive.
So the loss depends on who shares a batch: the other rows' positives are the negatives. Under
DDP each rank's batch is its own (the negatives are per rank; the run says so once); with
gradient accumulation each micro-batch is. ``data.group_by_length`` is kept: it only groups
rows of similar longest-text length, so no length cue tells a positive from the batch's
negatives (it changes which negatives are seen, as any batch order does).

Eval: ``eval_loss`` (in-batch, as training), then retrieval over the whole eval split: every
anchor against every eval positive (not only its batch), by cosine similarity.
``accuracy_at_1``: its own positive ranks first; ``mrr_at_10``: 1/rank within the top 10, else
0; ``recall_at_10``: ranks within the top 10 (one relevant text per anchor). A tie counts
against the anchor (rank = 1 + candidates scoring at least as high).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import Field

from ortft.data import batches
from ortft.families.embedding import pooling as pooling_files
from ortft.families.embedding.pooling import Pooling, pool_tokens
from ortft.tasks.base import Encoded, Task, TaskOptions

if TYPE_CHECKING:
    import torch

    from ortft.core.reports import ExportReport
    from ortft.tasks.protocols import JsCall

log = logging.getLogger("ortft")

TOP_K = 10  # mrr_at_10, recall_at_10
# the texts the model card's snippets embed (ortft.families.embedding.graphs)
CARD_TEXTS = ("A man is eating food.", "A man is eating a piece of bread.")
# export.json's task for a text encoder without a head that no recipe describes, which
# `ortft export` writes as this family's export (family.FeatureExtraction); a run's export is
# named for the run's task
FEATURE_EXTRACTION = "feature-extraction"


class Options(TaskOptions):
    name: Literal["sentence-embedding"] = "sentence-embedding"
    anchor_column: str = Field(
        "anchor", description="sentence-embedding: column with the anchor (query) text."
    )
    positive_column: str = Field(
        "positive", description="sentence-embedding: column with the text the anchor matches."
    )
    negative_column: str | None = Field(
        None,
        description="sentence-embedding: column with a hard negative per row (optional; "
        "scored against every anchor of the batch, beside the positives).",
    )
    scale: float = Field(
        20.0,
        gt=0,
        description="sentence-embedding: cosine similarities are multiplied by this before the "
        "softmax (1/temperature; sentence-transformers' MultipleNegativesRankingLoss default).",
    )
    pooling: Literal["auto", "mean", "cls", "max"] = Field(
        "auto",
        description="sentence-embedding: token vectors -> one vector per text, over the "
        "attention mask; auto: the model folder's sentence-transformers modules.json, else mean.",
    )
    normalize: Literal["auto", True, False] = Field(
        "auto",
        description="sentence-embedding: L2-normalise the saved and exported embedding (the loss "
        "uses cosine similarity either way); auto: as the model folder's modules.json says "
        "(a Normalize module), else false.",
    )


def ranks(similarity: np.ndarray) -> np.ndarray:
    """Each row's rank (1 = best) of its own column (the diagonal) among all columns; a tie
    counts against it."""
    own = np.diag(similarity)
    return (similarity >= own[:, None]).sum(axis=1)


def retrieval(anchors: np.ndarray, positives: np.ndarray) -> dict[str, float]:
    """accuracy_at_1, mrr_at_10, recall_at_10 of each anchor against every positive (cosine)."""
    if not len(anchors):
        return {"accuracy_at_1": 0.0, "mrr_at_10": 0.0, "recall_at_10": 0.0}
    a = anchors / np.maximum(np.linalg.norm(anchors, axis=1, keepdims=True), 1e-12)
    p = positives / np.maximum(np.linalg.norm(positives, axis=1, keepdims=True), 1e-12)
    r = ranks(a.astype(np.float64) @ p.astype(np.float64).T)
    return {
        "accuracy_at_1": float(np.mean(r == 1)),
        "mrr_at_10": float(np.mean(np.where(r <= TOP_K, 1.0 / r, 0.0))),
        "recall_at_10": float(np.mean(r <= TOP_K)),
    }


@dataclass
class SentenceEmbedding(Task):
    anchor_column: str = "anchor"
    positive_column: str = "positive"
    negative_column: str | None = None
    scale: float = 20.0
    pooling_option: str = "auto"
    normalize_option: Any = "auto"
    # what the run uses, once the model is known (prepare_model); until then the options' own
    pooling: Pooling = field(default_factory=Pooling)
    name = "sentence-embedding"
    pads_unread = True  # backend.unpad applies
    auto_class = "AutoModel"  # the bare encoder: last_hidden_state, no head
    row_local = True  # each row tokenized on its own
    needs_logits = True  # the embeddings are eval's "logits": retrieval over the whole split
    own_columns = True
    export_kind = "embedding"
    predicts = "embedding"
    eval_metrics = ("eval_loss", "eval_accuracy_at_1", "eval_mrr_at_10", "eval_recall_at_10")

    def js_call(self, tokenizer: Any, report: ExportReport) -> JsCall | None:
        """transformers.js's ``feature-extraction`` pipeline, pooled as the export pools."""
        return js_call(report)

    def __post_init__(self) -> None:
        mode = "mean" if self.pooling_option == "auto" else self.pooling_option
        self.pooling = Pooling(
            mode=mode,
            normalize=self.normalize_option is True,
            source="task options (the model folder not read yet)",
        )

    @property
    def texts_per_row(self) -> tuple[str, ...]:
        """The array prefixes of a row's texts, in the order they are stacked for the model."""
        return ("", "positive_") + (("negative_",) if self.negative_column else ())

    @property
    def aligned_keys(self) -> tuple[str, ...]:
        # every text's ids and mask: one value per input position, cut with input_ids
        return tuple(f"{p}{k}" for p in self.texts_per_row for k in ("input_ids", "attention_mask"))

    @property
    def options_key(self) -> str:
        return f"{self.anchor_column}|{self.positive_column}|{self.negative_column}"

    def columns(self, data: Any) -> list[str]:
        wanted = [self.anchor_column, self.positive_column, self.negative_column]
        return [c for c in wanted if c]

    def texts(self, rows: list[dict[str, Any]], data: Any) -> list[str]:
        return [str(r[c]) for r in rows for c in self.columns(data)]

    def encode(self, rows, tokenizer, data, label2id) -> Encoded:
        arrays: dict[str, np.ndarray] = {}
        for prefix, column in zip(self.texts_per_row, self.columns(data), strict=True):
            enc = tokenizer(
                [str(r[column]) for r in rows],
                max_length=data.max_length,
                truncation=True,
                padding="max_length",
                return_tensors="np",
            )
            arrays[f"{prefix}input_ids"] = enc["input_ids"].astype(np.int64)
            arrays[f"{prefix}attention_mask"] = enc["attention_mask"].astype(np.int64)
        masks = [arrays[f"{p}attention_mask"] for p in self.texts_per_row]
        # a row's batch is cut to its longest text (data.padding, data.group_by_length)
        arrays["_length"] = np.max([m.sum(axis=1) for m in masks], axis=0).astype(np.int32)
        # one label per row: 0, or -100 on eval's padded copies (left out of the loss)
        arrays["labels"] = np.zeros(len(rows), dtype=np.int64)
        return Encoded(arrays)

    def prepare_model(self, model: Any, processor: Any) -> None:
        """The pooling from the model's folder (its modules.json) unless the options set it;
        under DDP, say once that the negatives are per rank."""
        source = str(getattr(model, "name_or_path", "") or "")
        found = pooling_files.read(Path(source)) if source and Path(source).is_dir() else Pooling()
        mode = found.mode if self.pooling_option == "auto" else self.pooling_option
        normalize = found.normalize if self.normalize_option == "auto" else self.normalize_option
        said = [f"pooling={mode}"] if self.pooling_option != "auto" else []
        said += [f"normalize={normalize}"] if self.normalize_option != "auto" else []
        source_note = found.source + (f"; task.{', task.'.join(said)}" if said else "")
        self.pooling = dataclasses.replace(
            found, mode=mode, normalize=bool(normalize), source=source_note
        )
        log.info(
            "sentence-embedding: %s pooling%s (%s)",
            mode,
            ", L2-normalised" if normalize else "",
            source_note,
        )
        import torch.distributed as dist

        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        if world > 1 and dist.get_rank() == 0:
            log.warning(
                "sentence-embedding: in-batch negatives are per rank (%d processes): each "
                "anchor is scored against its own rank's batch, not the global one",
                world,
            )

    def cut(self, batch: dict[str, np.ndarray], padding: Any) -> dict[str, np.ndarray]:
        """Each text's ids and mask cut to its own kind's longest (as ``padding`` rounds it):
        stacked together, 32 BBC titles padded to their 64-token passages made a step of the
        shipped recipe's MiniLM 1.5x the tokens that sentence-transformers' two calls encode."""
        out = dict(batch)
        for prefix in self.texts_per_row:
            keys = (f"{prefix}input_ids", f"{prefix}attention_mask")
            own = {k: batch[k] for k in keys}
            own[batches.LENGTH] = batch[keys[1]].sum(axis=1)
            out.update({k: v for k, v in batches.cut(own, padding, keys).items() if k in keys})
        return out

    def forward(
        self,
        model: Any,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        labels: torch.Tensor,
        **extra: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        from ortft.families.embedding import lookup

        ids = [input_ids] + [extra[f"{p}input_ids"] for p in self.texts_per_row[1:]]
        masks = [attention_mask] + [extra[f"{p}attention_mask"] for p in self.texts_per_row[1:]]
        k, b = len(ids), input_ids.shape[0]
        # one call per text kind, each at its own length (``cut``), its words looked up already
        each = []
        for i, m, words in zip(ids, masks, lookup.one_lookup(model, ids), strict=True):
            with words:
                hidden = model(input_ids=i, attention_mask=m, return_dict=True).last_hidden_state
            each.append(pool_tokens(hidden, m, self.pooling.mode))
        pooled = torch.cat(each)
        unit = torch.nn.functional.normalize(pooled, p=2, dim=1)
        anchors, candidates = unit[:b], unit[b:]  # candidates: the positives, then negatives
        scores = anchors @ candidates.T * self.scale  # [b, (k - 1) * b]
        valid = labels >= 0  # eval's padded copies: neither a query nor a candidate
        scores = scores.masked_fill(~valid.repeat(k - 1)[None, :], torch.finfo(scores.dtype).min)
        target = torch.where(valid, torch.arange(b, device=labels.device), labels)
        loss = torch.nn.functional.cross_entropy(scores, target, ignore_index=-100)
        vectors = unit if self.pooling.normalize else pooled
        return loss, vectors.view(k, b, -1).transpose(0, 1)  # [b, texts, hidden]

    def metrics(
        self, loss: float, logits: list[np.ndarray], labels: list[np.ndarray]
    ) -> dict[str, Any]:
        vectors = np.concatenate(logits) if logits else np.zeros((0, 2, 1), dtype=np.float32)
        return {"loss": loss, **retrieval(vectors[:, 0], vectors[:, 1])}

    def write_extras(self, folder: Path, model: Any) -> None:
        """final/ as a sentence-transformers folder: modules.json, 1_Pooling/, ..."""
        pooling_files.write(folder, self.pooling, int(model.config.hidden_size))


def js_call(report: ExportReport) -> JsCall | None:
    """transformers.js's ``feature-extraction`` pipeline on the card's texts, pooled as the
    export pools; None where it cannot (max pooling, or lowercasing its tokenizer does not do)."""
    p = report["pooling"]
    if p["mode"] not in ("mean", "cls") or p["lowercase"]:
        return None
    options = {"pooling": p["mode"], "normalize": p["normalize"]}
    return "feature-extraction", [list(CARD_TEXTS)], options
