"""Vision-language (image-text-to-text), one family: the task's options, rows and metrics
(``task``), the LLaVA processor and config (``processor``), the model's parts as training
runs them (``model``), what the core calls on it (``family``) and ``ortft predict`` on JSONL
rows (``predict``). Reached through the task registry (``ortft.tasks.BUILTIN``); importing
this package imports no framework."""

from ortft.families.vision_language.family import build
from ortft.families.vision_language.task import Options

__all__ = ["Options", "build"]
