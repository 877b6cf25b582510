"""The commented starter recipe ``ortft init --task sequence-classification`` writes (``ortft.tools.starter``
fills in ``{name}``, the file's name, and ``{backend}``, the route this install trains on)."""

STARTER = """\
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
  name: {backend:<24}# ort (ORTModule: the ort profile), torch, or auto (probes them)
  allow_fallback: false         # never train on PyTorch silently

checkpoint:
  save_every: 100
  keep_last: 2

export:
  enabled: true                 # ONNX model + parity check in <run>/onnx/
"""
