"""The PyTorch engine (``engine``: backend.name torch, ort and auto) and what it is built from:
the module wrappers (``wrappers``: eager PyTorch in ``eager``, ORTModule in
``ortft.backends.ortmodule``), the ``auto`` probe, device and seeds (``device``), models and
tokenizers (``models``), AMP (``amp``), DDP (``distributed``) and DeepSpeed ZeRO (``deepspeed``)."""
