"""Score (``evaluate``) and run (``predict``) a trained model, on PyTorch or an ONNX export."""
