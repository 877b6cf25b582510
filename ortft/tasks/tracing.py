"""Whether a forward is being traced into a graph: ORTModule's ONNX export or a dynamo trace.

Some eager-only work in the tasks' forwards steps aside there: the head's padding to whole
blocks of rows (``lm_head.project``) and the embedding family's one lookup of the word table
(``ortft.families.embedding.lookup``). A traced graph would fix what that Python decides at the
first batch, or would not see it again.
"""

from __future__ import annotations

import torch


def traced() -> bool:
    """True while ORTModule exports the forward or dynamo traces it."""
    return torch.onnx.is_in_onnx_export() or torch.compiler.is_compiling()
