"""Values several layers must agree on, defined once."""

from __future__ import annotations

# The label transformers' losses skip (torch's CrossEntropyLoss ignore_index default): padding,
# prompt tokens and unpicked masked-LM positions get it, so they count in no loss or metric.
IGNORE_INDEX = -100
