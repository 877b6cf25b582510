"""Image classification, one family: the task's options, rows and metrics (``task``), the image
processor (``processor``), what the core calls on it (``family``), the ONNX export and its model
card (``graphs``), the preprocessing graph (``preprocess``), and ``ortft predict`` on image
files (``predict``). The image file checks and decoding stay in ``ortft.data.images``, which
text-to-image shares. Reached through the task registry (``ortft.tasks.BUILTIN``); importing
this package imports no framework."""

from ortft.families.vision.family import build
from ortft.families.vision.task import Options

__all__ = ["Options", "build"]
