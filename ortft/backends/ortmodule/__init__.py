"""ORTModule (backend.name ort): the wrapper that trains a PyTorch module through ONNX Runtime
with fallback off (``wrapper``), the ops it routes to PyTorch kernels (``kernels``) and the
dropout generator those kernels reseed per micro-step (``rng``)."""
