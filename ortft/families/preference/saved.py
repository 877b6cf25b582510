"""``ortft eval`` on a saved preference model (``final/``, a checkpoint or its ONNX export): the
loss and the reward metrics of each eval pair, as training's eval computes them.

The chosen and rejected sequences' logits come from the opened model (PyTorch or the exported
causal LM graph); DPO and IPO score them against the reference, the model the run started
from (the recipe's ``model:``), whose log-probs are read from the cache or computed once.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ortft.core.errors import InputError
from ortft.data.batches import Padding, eval_batches


def reference_model(loaded: Any, task: Any, tokenizer: Any) -> Any:
    """The policy the run started from: built from the recipe's ``model:`` as training built
    it (a ``from_config`` model with the run's seed)."""
    from ortft.backends.torch import hf_config, models

    vocab = hf_config.vocabulary(task, tokenizer)
    return models.build_model(loaded, task.auto_class, vocab, None, attn="eager")


def _token_logps(logits: np.ndarray, ids: np.ndarray) -> Any:
    import torch

    logps = torch.from_numpy(logits[:, :-1]).float().log_softmax(-1)
    return logps.gather(-1, torch.from_numpy(ids[:, 1:]).long().unsqueeze(-1)).squeeze(-1)


def evaluate(task: Any, m: Any, encoded: Any, loaded: Any, batch_size: int) -> dict[str, float]:
    import torch

    from ortft.families.preference import reference
    from ortft.families.preference.losses import concatenated, pick, read_positions

    split = encoded
    if task.options.loss != "orpo":
        if loaded is None:
            raise InputError(
                f"{m.path}: {task.options.loss} scores against the run's reference model, named "
                "by its recipe.yaml, which this folder lacks (eval the run's final/ or its "
                "run folder)"
            )
        split = reference.WithReference(encoded, Padding.of(loaded.recipe.data))
        reference.fill(reference_model(loaded, task, m.tokenizer), split, "eval")
    total, weight, rewards = 0.0, 0, []
    for batch in eval_batches(split, batch_size):
        valid = int(batch["_valid"])
        token = [
            _token_logps(
                m.logits(batch[f"{p}input_ids"], batch[f"{p}attention_mask"]),
                batch[f"{p}input_ids"],
            )
            for p in ("", "rejected_")
        ]
        tensors = {k: torch.from_numpy(np.asarray(v)) for k, v in batch.items() if k[0] != "_"}
        both = concatenated(tensors)  # what the training module gives: the positions read
        index = read_positions(task.options.loss, both["labels"], both["attention_mask"])
        with torch.no_grad():
            loss, pair_rewards = task.outside_loss(pick(torch.cat(token), index), tensors)
        n = task.counted(batch)
        total, weight = total + float(loss) * n, weight + n
        rewards.append(pair_rewards[:valid].numpy())
    return task.metrics(total / max(weight, 1), rewards, [])
