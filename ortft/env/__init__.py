"""Environment probes: which ONNX Runtime training build is installed and what it can run
(``ort_training``), the CUDA 11.8 libraries ORT's CUDA provider loads (``cudalibs``), and
ORTModule's C++ extensions, built and cached (``extensions``, run by ``make setup``)."""
