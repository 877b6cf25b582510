"""The commented starter recipe ``ortft init --task image-classification`` writes (``ortft.tools.starter``
fills in ``{name}``, the file's name, and ``{backend}``, the route this install trains on)."""

STARTER = """\
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
  name: {backend:<24}# ort (ORTModule: the ort profile), torch, or auto (probes them)

export:
  enabled: true                 # model.onnx + preprocess.onnx (raw uint8 pixels in) in <run>/onnx/
"""
