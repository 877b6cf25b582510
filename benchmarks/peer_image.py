"""ortft against transformers' Trainer on image classification: a ViT on the digits.

Each measurement runs in its own process.

Run (``make bench-peer-image``; 5 minutes on 2 quiet CPU cores, longer while it waits for
quiet; not in CI):

    python benchmarks/peer_image.py --pairs 5 --out benchmarks/results/peer-image.json

The fine-tune (recipes/bench/vit-digits.yaml): a ViT built from a config (random weights: no
pretrained vision model offline), image_size 32, patch 4 (64 patches + [CLS]), hidden 192,
4 layers, 3 heads, intermediate 768 (1.80M parameters), dropout 0, a 10-way head; batch 32,
lr 5e-5 with linear decay, no warm-up, no weight decay, gradient norm clipped at 1.0
(Trainer's defaults, set on ortft's side too), seed 42, fp32 unless the runner says otherwise,
CPU. The data: the 1438 training digits of recipes/data/digits/train.csv (8x8 grayscale PNGs;
both sides convert them to RGB and the image processor resizes them to 32x32, bilinear).

Why this size: a step is about 22 GFLOP (3 x 2 x 1.77M matmul weights x 65 tokens x 32 images,
attention scores adding 5%). Measured on 2 quiet cores: a median ort step of 194 ms, of which
ORT's session profile puts 183 ms in the graph's kernels (GEMMs 74% of them, PyTorch's
LayerNorm/GELU/cross-entropy kernels 12%), and decoding + resizing 32 PNGs takes 4-7 ms: the
model dominates the step, not the per-step Python. The recipe's ViT (hidden 64, 2 layers, 8x8
images) would be ~1 ms of matmul a step: a bench of the loop's overhead instead. At these
shapes (inner dimension 192) ORT's GEMMs are not faster than PyTorch's: in one process, step by
step, ORT took 178-185 ms and PyTorch 190-213 (1.09-1.10x); hidden 384 gave 1.01-1.08x.

Runners, alternating (trainer, trainer-bf16, torch, ort, trainer, ...) for ``--pairs`` rounds;
every measurement is a fresh process (a shared machine drifts 20-30% between processes, so only
back-to-back runs are compared):

- ``trainer``: ``transformers.Trainer`` over a torch ``Dataset`` that opens each PNG with Pillow,
  converts it to RGB and runs ``ViTImageProcessorPil(size=32x32)`` on it per item, the default
  collator (``default_data_collator``: stacks the tensors), ``TrainingArguments`` defaults
  except ``max_steps``, batch 32, ``use_cpu=True``, ``save_strategy="no"``,
  ``report_to="none"``, ``dataloader_num_workers=0`` (the default) and a temporary
  ``output_dir``. The model is ``ViTForImageClassification(ViTConfig(...))`` with the
  attention transformers picks by default: sdpa (recorded in the JSON as ``attention``).
- ``trainer-bf16``: the same with ``bf16=True`` (CPU autocast to bfloat16): Trainer's fastest
  setting on a CPU with AVX-512 BF16.
- ``torch`` / ``ort``: ``ortft train recipes/bench/vit-digits.yaml --json`` with the overrides in
  ``ORTFT_OVERRIDES`` and ``backend.name`` torch (sdpa attention) or ort (eager attention in
  ORT's graph), each at its defaults.

Timing: ``--warmup`` steps (default 4: ORT's export, allocator growth) then ``--steps`` timed
steps (default 20). A step's time is from the end of the step before to the end of this one,
alike on both sides: Trainer's ``on_step_end`` callback; ortft's metrics.jsonl ``time_s``.
Decoding, the processor, collation, forward, backward, clipping, the optimizer and scheduler
steps are all inside. samples/s = 32 x timed steps / their time; ms/step is the median of the
timed steps. The first step's loss of each run is kept (``loss_step1``): the inits differ
(each side draws its own random ViT), so they agree only roughly, near ln(10) = 2.30.

A shared machine: before each measurement the bench waits (``--wait``, 600 s at most) for a
second in which other work takes at most ``--max-busy`` (20%) of the CPU, and records the share
others took while the measurement ran (``others_share``). A round is clean when others took at
most 10% (``peer_common.OTHERS``) in each of its runs; rounds that are not are rerun
(``--retries`` more at most, 3) and the table summarizes the clean rounds only (all, where none
is clean; the JSON keeps every round). PyTorch's 2 OpenMP threads suffer most from a busy
neighbour (see ``peer_common.OTHERS``); ORT's least.

Offline: HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE / HF_DATASETS_OFFLINE are set for every process.
The scaffolding (the rounds, the quiet wait, the timing, the JSON and the table) is
benchmarks/peer_common.py, shared with peer_speech.py.
"""

from __future__ import annotations

import csv
import functools
import tempfile
from pathlib import Path
from typing import Any

import peer_common as common  # benchmarks/: the script's folder is on sys.path

RECIPE = common.REPO / "recipes" / "bench" / "vit-digits.yaml"
TRAIN_CSV = common.REPO / "recipes" / "data" / "digits" / "train.csv"
BATCH, LR, SEED, IMAGE = 32, 5e-5, 42, 32
VIT = {  # recipes/bench/vit-digits.yaml's model.from_config, as ViTConfig's fields
    "image_size": IMAGE,
    "patch_size": 4,
    "hidden_size": 192,
    "num_hidden_layers": 4,
    "num_attention_heads": 3,
    "intermediate_size": 768,
    "hidden_dropout_prob": 0.0,
    "attention_probs_dropout_prob": 0.0,
}
# ortft's side of the same fine-tune (the recipe holds these too)
ORTFT_OVERRIDES = common.trainer_overrides(LR, BATCH, SEED)


def digits() -> tuple[list[str], list[int]]:
    """The training digits' absolute paths and labels, in the csv's order."""
    with open(TRAIN_CSV, newline="") as fh:
        rows = list(csv.DictReader(fh))
    return [str(TRAIN_CSV.parent / r["image"]) for r in rows], [int(r["label"]) for r in rows]


def trainer_worker(bf16: bool, steps: int, warmup: int, out: Path) -> None:
    """One Trainer measurement in this process; writes its result as JSON to ``out``."""
    import torch
    from PIL import Image
    from transformers import Trainer, TrainingArguments, ViTConfig, ViTForImageClassification
    from transformers.models.vit import ViTImageProcessorPil

    paths, labels = digits()
    processor = ViTImageProcessorPil(size={"height": IMAGE, "width": IMAGE})

    class Digits(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(paths)

        def __getitem__(self, i: int) -> dict[str, Any]:
            with Image.open(paths[i]) as img:
                rgb = img.convert("RGB")
            pixels = processor(images=rgb, return_tensors="pt")["pixel_values"][0]
            return {"pixel_values": pixels, "labels": labels[i]}

    torch.manual_seed(SEED)
    model = ViTForImageClassification(ViTConfig(**VIT, num_labels=10))
    record = common.StepRecorder()
    with tempfile.TemporaryDirectory(prefix="peer-image-trainer-") as tmp:
        args = TrainingArguments(
            **common.trainer_arguments(
                tmp, LR, BATCH, warmup + steps, SEED, bf16, dataloader_num_workers=0
            )
        )
        trainer = record.trainer(Trainer)(
            model=model, args=args, train_dataset=Digits(), callbacks=[record.callback()]
        )
        result = trainer.train()
    common.write_json(out, record.result(steps, warmup, BATCH, result, model, args))


@functools.cache
def work() -> dict[str, Any]:
    """Every image is the same 64 patches + [CLS]: its useful training FLOPs (peer_common.work)."""
    import torch
    from transformers import ViTConfig, ViTForImageClassification

    from ortft.tools import flops

    config = ViTConfig(**VIT, num_labels=10)
    with torch.device("meta"):
        model = ViTForImageClassification(config)
    fm = flops.count(model, config, "image-classification")
    tokens = (IMAGE // VIT["patch_size"]) ** 2 + 1
    return common.work(fm, config, [(1, tokens, tokens * tokens)], BATCH)


BENCH = common.Bench(
    name="peer-image",
    script=__file__,
    recipe=RECIPE,
    batch=BATCH,
    overrides=ORTFT_OVERRIDES,
    model="ViT 32x32/4, hidden 192, 4 layers",
    worker=trainer_worker,
    extra={"lr": LR, "vit": VIT},
    work=work,
)


def task_peers() -> list[common.TaskPeer]:
    """This bench's rows of the one peer table (benchmarks/peers.py)."""
    return [common.task_peer(BENCH, "image")]


if __name__ == "__main__":
    common.main(BENCH, __doc__ or "")
