"""ONNX export of a trained model and its parity check against PyTorch (``exporter``), and the
torch.onnx / onnx graph helpers it uses (``onnx_tools``)."""
