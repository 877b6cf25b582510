"""ONNX Runtime's on-device training (backend.name ort-ondevice): the engine that trains the
exported artifacts with no PyTorch in the loop (``engine``), the artifact build (``build``,
``artifacts``), the learning-rate schedules it computes itself (``schedules``) and the trained
graph as the export's reference (``reference``)."""
