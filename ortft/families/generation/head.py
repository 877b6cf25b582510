"""The decoders' training forward with the head at the labelled positions only.

A causal LM's loss reads the logits of the positions whose next token carries a label: not the
padding, nor an instruction's prompt. ``HeadAtLabels`` runs the model's body and projects only
those positions onto the vocabulary (``ortft.tasks.lm_head``); the positions are found before
the wrapped module (``outside_inputs``), so ORTModule's and inductor's graphs take them as an
input. A model whose logits are more than its head (``lm_head.split``) runs transformers'
forward. The loss is the same either way (tests/test_lm_head.py).
"""

from __future__ import annotations

from typing import Any

from ortft.tasks.base import Task

INDEX = "label_index"  # the module's input: lm_head.label_positions of the batch's labels


class HeadAtLabels(Task):
    """``forward`` and ``outside_inputs`` (``protocols.RunsOutside``) of a causal LM task."""

    def forward(
        self, model: Any, input_ids: Any, attention_mask: Any, labels: Any, **extra: Any
    ) -> tuple[Any, Any]:
        """(loss, logits): the logits of the labelled positions only, [positions, vocabulary]
        (what the generation tasks' metrics read of them: nothing)."""
        from ortft.tasks import lm_head  # torch: a task is built torch-free (ortft validate)

        index = extra.pop(INDEX, None)
        parts = lm_head.split(model)
        if parts is None:
            return super().forward(model, input_ids, attention_mask, labels, **extra)
        body, head = parts
        hidden = lm_head.hidden_states(body, input_ids, attention_mask, **extra)
        return lm_head.next_token_loss(head, hidden, labels, index)

    def outside_inputs(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """The batch's tensors and the positions the head runs at."""
        from ortft.tasks import lm_head

        return {**inputs, INDEX: lm_head.label_positions(inputs["labels"])}
