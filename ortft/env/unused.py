"""Keep DeepSpeed out of the processes that do not use it.

transformers' ``save_pretrained`` unwraps every model through accelerate's
``extract_model_from_parallel``, which imports DeepSpeed whenever it is installed (to unwrap a
``DeepSpeedEngine``); DeepSpeed's own import then pulls in mlflow, setuptools and torch's
C++-extension builder. That is seconds of CPU in every run that writes a checkpoint or final/,
DeepSpeed run or not (docs/ci.md has the figure). A ``None`` entry in ``sys.modules`` makes
``importlib.util.find_spec`` answer "not installed", so accelerate and transformers skip it.

Scoped, not process-wide: a test process, or an hpo study, may run a DeepSpeed recipe next, and
the process may use transformers' ``Trainer`` after the run. accelerate decides once, when
``accelerate.utils`` is imported, whether to export its DeepSpeed helpers, while transformers
asks ``find_spec`` at each call: first imported inside the scope, ``accelerate.utils`` lacks
them, and ``import transformers.trainer`` then fails on ``DeepSpeedSchedulerWrapper``. So the
scope's end imports that package's ``__init__`` again (re-exports only; it imports no DeepSpeed).
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Iterator

DEEPSPEED = "deepspeed"
ACCELERATE_UTILS = "accelerate.utils"


@contextlib.contextmanager
def without_deepspeed(needed: bool = False) -> Iterator[None]:
    """Inside: DeepSpeed reads as not installed, unless ``needed`` or it is already imported.
    An ``import deepspeed`` there raises ``ModuleNotFoundError`` (a bug to see, not to hide)."""
    if needed or DEEPSPEED in sys.modules:
        yield
        return
    accelerate_before = ACCELERATE_UTILS in sys.modules
    sys.modules[DEEPSPEED] = None  # type: ignore[assignment]
    try:
        yield
    finally:
        if DEEPSPEED in sys.modules and sys.modules[DEEPSPEED] is None:
            del sys.modules[DEEPSPEED]
        if not accelerate_before and ACCELERATE_UTILS in sys.modules:
            importlib.reload(sys.modules[ACCELERATE_UTILS])  # with its DeepSpeed helpers now
