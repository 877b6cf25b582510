"""The commented starter recipe ``ortft init --task speech-recognition`` writes (``ortft.tools.starter``
fills in ``{name}``, the file's name, and ``{backend}``, the route this install trains on)."""

STARTER = """\
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
  name: {backend:<24}# ort (ORTModule: the ort profile), torch, or auto (probes them)

export:
  enabled: true                 # features.onnx + encoder_model.onnx + decoder_model_merged.onnx
"""
