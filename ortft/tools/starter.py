"""Shipped recipes (``ortft recipes``) and the commented starter recipe (``ortft init``)."""

from __future__ import annotations

from pathlib import Path

from ortft.core.errors import UsageError


def recipes_dir() -> Path:
    """The top-level recipes/ of a source checkout, else the copy installed with the package."""
    package = Path(__file__).resolve().parents[1]  # ortft/
    for candidate in (package.parent / "recipes", package / "recipes"):
        if candidate.is_dir():
            return candidate
    raise UsageError("no shipped recipes found (is ortft installed completely?)")


def shipped_recipes() -> list[tuple[Path, str]]:
    """(path, one-line description) for every shipped recipe, sorted."""
    base = recipes_dir()
    out = []
    for path in sorted(base.rglob("*.yaml")):
        summary = ""
        for line in path.read_text().splitlines():
            text = line.lstrip("# ").strip()
            if (
                line.startswith("#")
                and text
                and not text.startswith(("Run:", "Override", "ortft ", "yaml-language-server:"))
            ):
                summary = text
                break
        out.append((path, summary))
    return out


_STARTERS = {
    "sequence-classification": """\
# A text classifier. Run:
#   ortft train {name}
# Override anything from the command line, e.g.:
#   ortft train {name} training.max_steps=20 backend.name=torch

model:
  name_or_path: path/to/model   # a local Hugging Face model folder, pkg://<package>/<dir>, or a Hub id
  dropout: null                 # set 0.0 for bit-for-bit comparable runs

task: sequence-classification

data:
  train: data/train.csv         # csv / json / jsonl / parquet / txt / folder of class sub-folders
  eval: null                    # or hold out a share of train:
  eval_fraction: 0.1
  text_column: text
  label_column: label
  max_length: 128               # every batch is padded to this: ORT exports its graph once

training:
  epochs: 1
  batch_size: 16
  lr: 5.0e-5
  scheduler: linear
  warmup_ratio: 0.1
  log_every: 10
  eval_every: 50

backend:
  name: ort                     # ort (ONNX Runtime ORTModule) or torch
  allow_fallback: false         # never train on PyTorch silently

checkpoint:
  save_every: 100
  keep_last: 2

export:
  enabled: true                 # ONNX model + parity check in <run>/onnx/
""",
    "causal-lm": """\
# A small GPT-2-style language model trained from scratch. Run:
#   ortft train {name}
# Override anything from the command line, e.g.:
#   ortft train {name} training.max_steps=20 backend.name=torch

model:
  from_config:
    architecture: gpt2
    hidden_size: 128
    num_layers: 2
    num_heads: 2
  tokenizer:
    train: {{kind: byte-bpe, vocab_size: 2000}}

task: causal-lm

data:
  train: data/corpus.txt        # paragraphs separated by blank lines
  eval_fraction: 0.1
  max_length: 128
  packing: true

training:
  max_steps: 200
  batch_size: 8
  lr: 1.0e-3
  warmup_ratio: 0.05

backend:
  name: ort

export:
  enabled: true
""",
    "image-classification": """\
# An image classifier (ViT, DeiT, BEiT, Swin, ConvNeXt, ResNet...). Run:
#   ortft train {name}
# Override anything from the command line, e.g.:
#   ortft train {name} training.max_steps=20 backend.name=torch

model:
  name_or_path: path/to/model   # a local model folder with its preprocessor_config.json
  # or a model built from scratch (its image processor then resizes to image_size):
  # from_config: {{architecture: vit, hidden_size: 64, num_layers: 2, num_heads: 4,
  #               options: {{image_size: 32, patch_size: 4}}}}

task:
  name: image-classification
  random_resized_crop: false    # train-time augmentation, seeded (resume stays exact)
  horizontal_flip: false

data:
  train: ./data/images          # a folder of <label>/<image> files, or a csv/jsonl with
  eval_fraction: 0.1            #   an image path column (relative to that file) and a label
  image_column: image
  label_column: label
  on_bad_file: error            # or skip: left out and counted in summary.json

training:
  epochs: 3
  batch_size: 32
  lr: 1.0e-4
  scheduler: linear
  warmup_ratio: 0.1
  log_every: 10
  eval_every: 100

backend:
  name: ort

export:
  enabled: true                 # model.onnx + preprocess.onnx (raw uint8 pixels in) in <run>/onnx/
""",
    "speech-recognition": """\
# A speech recognizer (Whisper): audio files to transcripts. Run:
#   ortft train {name}
# Override anything from the command line, e.g.:
#   ortft train {name} training.max_steps=20 backend.name=torch

model:
  name_or_path: path/to/whisper  # a local Whisper folder: config, weights, processor_config.json
                                 # (or preprocessor_config.json) and its tokenizer files
  # or a Whisper built from scratch, with a tokenizer trained on the transcripts:
  # from_config: {{architecture: whisper, hidden_size: 128, num_layers: 2, num_heads: 4,
  #               options: {{num_mel_bins: 80, max_source_positions: 1500}}}}   # 1500: 30 s
  # tokenizer: {{train: {{kind: byte-bpe, vocab_size: 1000}}}}

task:
  name: speech-recognition
  language: en                  # the decoder's language token
  generate_samples: 256         # eval clips transcribed for WER / CER

data:
  train: ./data/train.jsonl     # rows with an audio path (relative to this file) and its text;
  eval: ./data/eval.jsonl       #   or a folder with a metadata.jsonl / metadata.csv
  audio_column: audio           # WAV, FLAC or OGG; any rate and channels (made 16 kHz mono)
  text_column: text
  on_bad_file: error            # or skip: left out and counted in summary.json

training:
  epochs: 3
  batch_size: 16
  lr: 1.0e-5
  scheduler: linear
  warmup_ratio: 0.1
  log_every: 10
  eval_every: 200

backend:
  name: ort

export:
  enabled: true                 # features.onnx + encoder.onnx + decoder.onnx in <run>/onnx/
""",
}


def recipe_text(task: str, name: str = "recipe.yaml") -> str:
    if task not in _STARTERS:
        raise UsageError(f"--task must be one of: {', '.join(_STARTERS)} (got '{task}')")
    return _STARTERS[task].format(name=name)
