"""Matrix-multiply FLOPs of a training step, from the shapes it ran (the MFU numerator).

A forward pass over ``rows`` rows of ``length`` positions costs

- ``2 × per_token × rows × length``: every weight matrix applied at every position (attention's
  Q/K/V/output projections, the MLP, an LM head, tied to the embedding or not);
- ``2 × per_row × rows``: the weights applied once per row (a classifier's pooler and head);
- ``4 × layers × width × rows × length²``: attention's scores (Q·Kᵀ) and weighted values (·V),
  counted in full for causal models too (PaLM's MFU convention);

and forward + backward is taken as 3 × the forward (the backward computes two products per
forward one: the input's gradient and the weight's). Embedding tables are lookups, not matmuls,
and are left out, as are biases, LayerNorm, softmax and activations (no matmuls). The former
``6 × parameters × batch × max_length`` counted the embeddings (1.7M of bert-cls's 4.9M
parameters; 3.2M are matmul weights) and padding that ``data.padding: longest`` no longer
runs: it read 109.8% for torch.

"Useful" FLOPs are those of the real tokens only: a row of ``l`` real tokens costs what a
batch of one row cut to ``l`` would (``Σ l`` and ``Σ l²`` over the rows); "hardware" FLOPs are
those of the padded shapes that ran.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# sequence-classification heads that read one position per row (BERT's pooler + classifier,
# RoBERTa's classifier.dense/out_proj, DistilBERT's pre_classifier); GPT-2's `score` is applied
# at every position (the last one is picked after) and stays per-token
PER_ROW_MODULES = {"pooler", "classifier", "pre_classifier"}


@dataclass(frozen=True)
class FlopModel:
    per_token: int  # matmul weights applied at every position
    per_row: int  # matmul weights applied once per row
    layers: int  # attention layers
    width: int  # attention heads × head size

    def forward(self, rows: int, length: int) -> float:
        """Forward FLOPs of ``rows`` rows padded to ``length``."""
        return (
            2.0 * self.per_token * rows * length
            + 2.0 * self.per_row * rows
            + 4.0 * self.layers * self.width * rows * length**2
        )

    def hardware(self, rows_per_micro: int, batch_lengths: list[int]) -> float:
        """Training FLOPs of a step whose micro-batches ran at ``batch_lengths`` (padded)."""
        return 3.0 * sum(self.forward(rows_per_micro, n) for n in batch_lengths)

    def useful(self, rows: int, tokens: int, tokens_sq: int) -> float:
        """Training FLOPs the real tokens need: ``tokens`` = Σ l, ``tokens_sq`` = Σ l² over the
        step's ``rows`` rows (each row cut to its own length)."""
        return 3.0 * (
            2.0 * self.per_token * tokens
            + 2.0 * self.per_row * rows
            + 4.0 * self.layers * self.width * tokens_sq
        )

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def count(model: Any, config: Any, task: str) -> FlopModel | None:
    """The FLOP model of ``model`` (any ``nn.Module``; its weights may be on the meta device).
    None for encoder-decoder models: their decoder's lengths are not the input's."""
    import torch
    from transformers.pytorch_utils import Conv1D

    if getattr(config, "is_encoder_decoder", False):
        return None
    per_token = per_row = 0
    for name, module in model.named_modules():
        if not isinstance(module, (torch.nn.Linear, Conv1D)):
            continue  # nn.Embedding is a lookup; a tied LM head is an nn.Linear and counts
        n = module.weight.numel()
        if task == "sequence-classification" and PER_ROW_MODULES & set(name.split(".")):
            per_row += n
        else:
            per_token += n
    heads = config.num_attention_heads
    head_size = getattr(config, "head_dim", None) or config.hidden_size // heads
    return FlopModel(per_token, per_row, config.num_hidden_layers, heads * head_size)


def from_saved(model_dir: Path, auto_class: str, task: str) -> FlopModel | None:
    """The FLOP model of the model saved in ``model_dir`` (its config.json), built on the meta
    device: no weights are allocated or read."""
    import torch
    import transformers

    config = transformers.AutoConfig.from_pretrained(model_dir)
    auto = getattr(transformers, auto_class)
    try:
        # import the model class outside the meta context: importing transformers' modules
        # under it fails (they build tensors at import time)
        model_class = auto._model_mapping[type(config)]
    except (AttributeError, KeyError):
        return count(auto.from_config(config), config, task)  # on the CPU, a few seconds
    with torch.device("meta"):
        model = model_class(config)
    return count(model, config, task)
