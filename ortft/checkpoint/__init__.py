"""Checkpoints: every ``step-NNNNNN/`` any engine writes (``store.write_step``: atomic swap,
manifest, verify, prune, resume point; the PyTorch weights, optimizer and RNG state), and the
best eval's weights in ``best/`` (``best``). Torch is imported only where weights are."""
