"""ortft: fine-tune Hugging Face transformers from a YAML recipe through ONNX Runtime."""

__version__ = "0.1.0"
