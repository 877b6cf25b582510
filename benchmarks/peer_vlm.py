"""ortft against transformers' Trainer on image-text-to-text: a tiny LLaVA on the digit questions.

Each measurement runs in its own process.

Run (``make bench-peer-vlm``; not in CI):

    python benchmarks/peer_vlm.py --pairs 3 --out benchmarks/results/peer-vlm.json

The fine-tune: recipes/image-text-to-text.yaml's model, the same on both sides, built from the
recipe's config by ortft's own code (``processor.model_config``: a CLIP vision tower, hidden
64, 2 layers, 8x8 images in 16 patches of 2x2; the two-layer GELU projector; a Llama, hidden
64, 2 layers, 4 heads, intermediate 256) and the same ``LlavaProcessor`` (CLIP's PIL image
processor at 8x8, a byte-level BPE of 300 trained on the rows' texts plus ``<image>``, the
recipe's chat template), random weights. The vision tower is frozen, ortft's default
(``task.freeze_vision=true``; the shipped recipe trains it because its tower is random): the
projector and the language model train. The data: the 2876 rows of
recipes/data/digit-questions/train.jsonl (the 8x8 digit scans, "Which digit is this?" and
"Is this digit even or odd?"), no eval. Batch 32, each batch padded to its longest row (about
46 tokens, 16 of them the image's), lr 2e-3 with linear decay, no warm-up, no weight decay,
gradient norm clipped at 1.0 (Trainer's defaults, set on ortft's side too), seed 42, no
dropout, CPU.

Runners, alternating (trainer, trainer-bf16, trainer-compile, torch, torch-bf16, ort,
torch-compile, auto, trainer, ...) for ``--pairs`` rounds; every measurement a fresh process
(peer_common):

- ``trainer``: ``transformers.Trainer`` as Hugging Face's VLM fine-tuning recipe runs it: a
  torch ``Dataset`` whose items are the row's image (Pillow, converted to RGB) and its
  conversation (ortft's reading of the row: the same messages), and a collator that renders
  each conversation with the processor's chat template, runs
  ``processor(text=..., images=..., padding=True)`` on the batch and sets labels to the
  input ids with the pad and image tokens masked to -100 (the recipe's loss covers the
  prompt too, ortft's only the answers: the same logits and cross-entropy either way);
  ``remove_unused_columns=False``, ``TrainingArguments`` defaults otherwise, as peer_image.py
  (``use_cpu=True``, no checkpoints, no trackers, ``dataloader_num_workers=0``).
- ``trainer-bf16``: the same with ``bf16=True`` (CPU autocast); ``trainer-compile``:
  ``torch_compile=True`` as the Trainer ships it (a failure is its result, in one line).
- ``torch`` / ``torch-bf16`` / ``ort``: ``ortft train recipes/image-text-to-text.yaml --json``
  with ``ORTFT_OVERRIDES`` and the route's backend (and ``precision.dtype=bf16``);
  ``torch-compile``: ``backend.compile=true`` (inductor; its compile is the first warm-up
  step, as ``trainer-compile``'s is); ``auto``: ``backend.name=auto precision.dtype=auto
  precision.weights=auto`` (its probe picks the route and its precision).

Every runner runs with the environment's ``OMP_WAIT_POLICY`` (libgomp's default where it sets
none, as every peer bench; the JSON's ``omp_wait_policy``). Figures:
docs/vision-language.md#speed.

Timing (peer_common): ``--warmup`` steps (default 4: ORT's export, allocator growth), then
``--steps`` timed steps (default 20), each from the end of the step before to its own end:
image decoding, the image processor, tokenizing (the Trainer's collator; ortft tokenizes once
before step 1), forward, backward, clipping and the optimizer are inside. ``peak_rss_mb``: each
process's peak RSS. ``best_ratio`` (the report): each round's best ortft runner over its best
Trainer runner, samples/s. ``batch_length``: the Trainer's mean padded batch length.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import peer_common as common  # benchmarks/: the script's folder is on sys.path

RECIPE = common.REPO / "recipes" / "image-text-to-text.yaml"
TRAIN = common.REPO / "recipes" / "data" / "digit-questions" / "train.jsonl"
BATCH, LR, SEED = 32, 2e-3, 42
TRAINERS = ("trainer", "trainer-bf16", "trainer-compile")
ORTFT_RUNNERS = {
    "torch": {"backend.name": "torch", "precision.dtype": "fp32"},
    "torch-bf16": {"backend.name": "torch", "precision.dtype": "bf16"},
    "torch-bf16w": common.BF16_WEIGHTS,
    "ort": {"backend.name": "ort", "precision.dtype": "fp32"},
    # the Trainer's torch_compile as ortft runs it: inductor, its first step (the compile) is
    # one of the untimed warm-up steps, as the Trainer's is
    "torch-compile": {
        "backend.name": "torch",
        "precision.dtype": "fp32",
        "backend.compile": "true",
    },
    "auto": common.AUTO,
}
# ortft's side of the same fine-tune, over the recipe
VLM_OVERRIDES = {
    "task.freeze_vision": "true",  # ortft's default; the shipped recipe trains its random tower
    "task.generate_samples": "0",
    "data.eval": "null",
}
ORTFT_OVERRIDES = common.trainer_overrides(LR, BATCH, SEED, **VLM_OVERRIDES)


def recipe() -> Any:
    """The recipe with ``ORTFT_OVERRIDES``: the model, processor and data both sides use."""
    from ortft.recipe import io as recipe_io

    overrides = [f"{k}={v}" for k, v in ORTFT_OVERRIDES.items()]
    return recipe_io.load(RECIPE, overrides, check_files=False).recipe


def conversations(task: Any) -> list[tuple[str, list[dict[str, Any]]]]:
    """Each training row's image path and conversation, as ortft reads the row."""
    lines = TRAIN.read_text(encoding="utf-8").splitlines()
    rows = [json.loads(ln) for ln in lines if ln.strip()]
    out = []
    for i, row in enumerate(rows):
        path = (TRAIN.parent / row["image"]).resolve()
        out.append((str(path), task.messages(row, i)))
    return out


def texts(rows: list[tuple[str, list[dict[str, Any]]]]) -> list[str]:
    """Every text part of the conversations: what ortft trains the tokenizer on."""
    return [
        part["text"]
        for _, messages in rows
        for message in messages
        for part in message["content"]
        if part["type"] == "text"
    ]


def processor_and_model(r: Any, sample: list[str]) -> tuple[Any, Any]:
    """ortft's processor for the recipe (its tokenizer trained on ``sample``, the rows' texts)
    and a random LLaVA of the recipe's config, its vision tower frozen."""
    import torch
    from transformers import LlavaForConditionalGeneration

    from ortft.backends.torch import models
    from ortft.families.vision_language import processor as vlm

    tokenizer = models.train_tokenizer(sample, r.model.tokenizer.train)
    processor = vlm.for_config(r.task, tokenizer)
    config = vlm.model_config(r.model.from_config, r.task, processor.tokenizer, r.model.dropout)
    torch.manual_seed(SEED)
    model = LlavaForConditionalGeneration(config)
    model.model.vision_tower.requires_grad_(False)
    return processor, model


def collator(processor: Any, lengths: list[int]) -> Any:
    """Hugging Face's VLM fine-tuning collator: chat template, ``processor(text, images)``,
    labels = input ids with pad and image tokens at -100; ``lengths`` gets each batch's."""
    pad, image = processor.tokenizer.pad_token_id, processor.image_token_id

    def collate(items: list[dict[str, Any]]) -> dict[str, Any]:
        texts = [processor.apply_chat_template(x["messages"], tokenize=False) for x in items]
        batch = processor(
            text=texts, images=[x["image"] for x in items], padding=True, return_tensors="pt"
        )
        labels = batch["input_ids"].clone()
        labels[labels == pad] = -100
        labels[labels == image] = -100
        batch["labels"] = labels
        lengths.append(int(labels.shape[1]))
        return dict(batch)

    return collate


def trainer_worker(runner: str, steps: int, warmup: int, out: Path) -> None:
    """One Trainer measurement in this process (``runner``: one of ``TRAINERS``); its JSON."""
    import torch
    from PIL import Image
    from transformers import Trainer, TrainingArguments

    from ortft.families.vision_language import build

    r = recipe()
    task = build(r.task)
    rows = conversations(task)
    processor, model = processor_and_model(r, texts(rows))

    class Rows(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(rows)

        def __getitem__(self, i: int) -> dict[str, Any]:
            path, msgs = rows[i]
            with Image.open(path) as img:
                rgb = img.convert("RGB")
            return {"image": rgb, "messages": msgs}

    lengths: list[int] = []
    record = common.StepRecorder()
    setting: dict[str, Any] = {
        "remove_unused_columns": False,
        "dataloader_num_workers": 0,
        "disable_tqdm": True,  # a failure's last stderr line is its error, not a progress bar
    }
    if runner == "trainer-compile":
        setting["torch_compile"] = True
    with tempfile.TemporaryDirectory(prefix="peer-vlm-trainer-") as tmp:
        args = TrainingArguments(
            **common.trainer_arguments(
                tmp, LR, BATCH, warmup + steps, SEED, runner == "trainer-bf16", **setting
            )
        )
        trainer = record.trainer(Trainer)(
            model=model,
            args=args,
            train_dataset=Rows(),
            data_collator=collator(processor, lengths),
            callbacks=[record.callback()],
        )
        result = trainer.train()
    common.write_json(out, {
        **record.result(steps, warmup, BATCH, result, model, args),
        "torch_compile": bool(args.torch_compile),
        "batch_length": statistics.mean(lengths),
        "trainable_parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
    })  # fmt: skip


def report(result: dict[str, Any]) -> None:
    """Each round's best ortft runner over its best Trainer runner (samples/s), into the JSON
    as ``best_ratio``, and the Trainer's padded batch length."""
    best = result["best_ratio"] = common.best_ratio(result["rounds"], TRAINERS)
    if best["median"] is not None:
        lo, hi = best["range"]
        print(
            f"peer-vlm: best ortft / best Trainer, all {len(best['which'])} rounds: "
            f"{best['median']:.2f}× (range {lo:.2f}–{hi:.2f}; {', '.join(best['which'])})"
        )
    else:
        print("peer-vlm: best ortft / best Trainer: no figure (no round where both sides ran)")
    runs = [v for one in result["rounds"] for v in one.values() if v["ok"]]
    lengths = [v["batch_length"] for v in runs if "batch_length" in v]
    if lengths:
        print(f"peer-vlm: the Trainer's mean batch length: {statistics.median(lengths):.1f} tokens")


BENCH = common.Bench(
    name="peer-vlm",
    script=__file__,
    recipe=RECIPE,
    batch=BATCH,
    overrides=ORTFT_OVERRIDES,
    model="tiny LLaVA (CLIP 64x2 frozen, Llama 64x2), 8x8 digits",
    worker=lambda bf16, steps, warmup, out: trainer_worker(TRAINERS[int(bf16)], steps, warmup, out),
    extra={"lr": LR, "recipe": str(RECIPE.relative_to(common.REPO))},
    extra_keys=("batch_length",),
    bases=(TRAINERS[0], TRAINERS[1]),
    more_peers=TRAINERS[2:],
    named_worker=trainer_worker,
    ortft_runners=ORTFT_RUNNERS,
    report=report,
)


def task_peers() -> list[common.TaskPeer]:
    """This bench's row of the one peer table (benchmarks/peers.py)."""
    policy = os.environ.get("OMP_WAIT_POLICY")
    bench = replace(BENCH, extra={**BENCH.extra, "omp_wait_policy": policy})
    return [common.task_peer(bench, "image-text-to-text")]


if __name__ == "__main__":
    policy = os.environ.get("OMP_WAIT_POLICY")
    common.main(replace(BENCH, extra={**BENCH.extra, "omp_wait_policy": policy}), __doc__ or "")
