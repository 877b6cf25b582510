"""Sentence embedding as the core sees it: the task (``task.SentenceEmbedding``) with the
protocols of ``ortft.tasks.protocols`` it implements: its export (``graphs``), the folders eval
and predict hand it (a run, a model folder or an export that embeds: ``eval_retrieval``,
``predict``), and ``ortft export`` of a text encoder without a task head that no recipe
describes (``FeatureExtraction``). Each hook imports torch or transformers lazily, so building
the task for ``ortft validate`` stays torch-free."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ortft.core.reports import EvalResult, Prediction
from ortft.families.embedding import pooling
from ortft.families.embedding.task import FEATURE_EXTRACTION, Options, SentenceEmbedding
from ortft.tasks.protocols import Builder


class Embedding(SentenceEmbedding):
    """``SentenceEmbedding`` with the protocol hooks the core calls."""

    def export_builder(
        self, model: Any, processor: Any, opset: int, tolerance: float, samples: Any, options: Any
    ) -> Builder:
        """model.onnx (``last_hidden_state``, ``sentence_embedding``) pooled as
        ``options.pooling`` says (None: mean, no L2), checked against PyTorch, then in the other
        runtimes the options name (``graphs.EncoderGraph``)."""
        from functools import partial

        from ortft.export.exporter import PARITY_SAMPLES, other_runtimes
        from ortft.families.embedding.graphs import EncoderGraph

        job = EncoderGraph(
            model.eval().to("cpu"),
            processor,
            options,
            task=self.name,
            opset=opset,
            tolerance=tolerance,
            samples=samples,
            n=PARITY_SAMPLES,
        )
        runtimes = partial(
            other_runtimes, feeds=job.feeds, tolerance=tolerance, pythons=options.check_runtimes
        )
        return partial(job.build, runtimes=runtimes)

    def embeds(self, source: Path) -> bool:
        """An export with a ``sentence_embedding`` output, a run or model folder whose task
        embeds, or a text encoder without a head that no recipe describes (``predict.embeds``)."""
        from ortft.families.embedding import predict

        return predict.embeds(source)

    def evaluate_embeddings(
        self, source: Path, data_file: Path | None, batch_size: int
    ) -> EvalResult:
        """Retrieval over the eval pairs and the in-batch loss (``eval_retrieval``)."""
        from ortft.families.embedding import eval_retrieval

        return eval_retrieval.run(source, data_file, batch_size)

    def predict_embeddings(
        self,
        source: Path,
        texts: list[str],
        where: str,
        *,
        query: str | None,
        top_k: int | None,
        max_length: int | None,
        batch_size: int,
    ) -> Iterator[Prediction]:
        """One embedding per text, or (``query``) the texts ranked (``predict.run``)."""
        from ortft.families.embedding import predict

        return predict.run(
            source,
            texts,
            where,
            query=query,
            top_k=top_k,
            max_length=max_length,
            batch_size=batch_size,
        )

    def plain_encoder(self, config: Any) -> bool:
        """A text encoder without a task head (``BertModel``): what ``AutoModel`` builds."""
        from ortft.families.embedding import graphs

        return graphs.bare_encoder(config)

    def plain_task(self) -> FeatureExtraction:
        """The family's export of such an encoder, named ``feature-extraction``."""
        return FeatureExtraction()

    def plain_options(self, folder: Path) -> dict[str, Any]:
        """The folder's pooling (its sentence-transformers files; none: mean, no L2)."""
        return {"pooling": pooling.read(folder)}


class FeatureExtraction(Embedding):
    """A text encoder without a task head, exported without a task: the family's export under
    export.json's task ``feature-extraction``, pooled as ``ortft export`` reads its folder."""

    name = FEATURE_EXTRACTION


def build(section: Options) -> Embedding:
    return Embedding(
        section.anchor_column,
        section.positive_column,
        section.negative_column,
        section.scale,
        section.pooling,
        section.normalize,
    )
