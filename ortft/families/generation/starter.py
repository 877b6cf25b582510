"""The commented starter recipe ``ortft init --task causal-lm`` writes (``ortft.tools.starter``
fills in ``{name}``, the file's name, and ``{backend}``, the route this install trains on)."""

STARTER = """\
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
  name: {backend:<24}# ort (ORTModule: the ort profile), torch, or auto (probes them)

export:
  enabled: true
"""
