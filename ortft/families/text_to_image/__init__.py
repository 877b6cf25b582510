"""Text-to-image (Stable Diffusion fine-tuning), one family: the task's options, rows and loss
(``task``), the Stable Diffusion's parts, its tokenizer and final/ (``diffusion``), what the core
calls on it (``family``), the ONNX graphs and model card (``graphs``), their numpy drawing loop
(``runner``, copied into each export as draw.py), ``ortft eval``'s diffusion loss
(``eval_loss``) and ``ortft predict --prompt`` (``draw``). Reached through the task registry
(``ortft.tasks.BUILTIN``); importing this package imports no framework."""

from ortft.families.text_to_image.family import build
from ortft.families.text_to_image.task import Options

__all__ = ["Options", "build"]
