"""Preference tuning of a causal LM on ``{prompt, chosen, rejected}`` pairs: DPO, IPO and ORPO
(``task``: options and rows; ``losses``: the losses, outside the wrapped module;
``reference``: the reference log-probs and their cache; ``family``: the task the core calls).
docs/preference.md has the recipe keys and the formulas with TRL's source lines.

The task registry (``ortft.tasks.BUILTIN``) names this package; importing it imports no
framework."""

from ortft.families.preference.family import build
from ortft.families.preference.task import Options

__all__ = ["Options", "build"]
