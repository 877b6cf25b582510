"""Speech recognition (Whisper), one family: the task's options, rows and metrics (``task``),
the clips (``audio``), the processor (``processor``), what the core calls on it (``family``), the
ONNX graphs (``graphs``, ``features``), their runner (``runner``) and model card (``card``), and
``ortft predict`` on audio files (``predict``). Reached through the task registry
(``ortft.tasks.BUILTIN``); importing this package imports no framework."""

from ortft.families.speech.family import build
from ortft.families.speech.task import Options

__all__ = ["Options", "build"]
