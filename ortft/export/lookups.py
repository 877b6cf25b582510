"""Embedding lookups whose indices are broadcast over the batch, found in an ONNX graph.

ORT 1.19's offline gradient builder (``onnxruntime.training.artifacts``) turns a lookup
``Gather(weight, ids)`` into ``GatherGrad(shape, ids, grad)``. When ``ids`` is transformers'
position buffer, shape (1, sequence), and the looked-up rows are broadcast over the batch
afterwards, the builder feeds GatherGrad the (batch, sequence, hidden) gradient unreduced. The
kernel walks that gradient and writes each batch row after the first past the end of its
(positions, hidden) output: a heap corruption (abort, segfault, NaN) from batch 14 on for a tiny
BERT, and whenever the length grows between steps on ``recipes/bench/bert-cls.yaml``; a wrong
position-embedding gradient when it survives. Ids computed from an input's values (input_ids, or
ids made from it) carry the batch dimension, so the check asks where the ids come from. No
PyTorch here: the on-device engine checks given artifacts with it.
"""

from __future__ import annotations

from typing import Any


def broadcast_lookups(graph: Any, data_inputs: set[str], op: str = "Gather") -> list[str]:
    """The parameters that ``op`` nodes (Gather, or GatherGrad in a training graph) look up
    with indices (input 1) computed from constants and shapes alone, not from ``data_inputs``."""
    producer = {out: node for node in graph.node for out in node.output}
    from_data: dict[str, bool] = {}

    def carries_data(name: str) -> bool:
        stack = [name]
        while stack:  # iterative: a deep model's graph would exceed Python's recursion limit
            top = stack[-1]
            node = producer.get(top)
            if top in data_inputs or node is None or node.op_type == "Shape":
                from_data[stack.pop()] = top in data_inputs
                continue
            todo = [x for x in node.input if x and x not in from_data]
            if todo:
                stack.extend(todo)
            else:
                from_data[stack.pop()] = any(from_data[x] for x in node.input if x)
        return from_data[name]

    params = {i.name for i in graph.initializer} | {i.name for i in graph.input}
    params -= data_inputs

    def looked_up(node: Any) -> str:  # GatherGrad writes "<parameter>_grad"
        return node.input[0] if op == "Gather" else node.output[0].removesuffix("_grad")

    return sorted(
        looked_up(node)
        for node in graph.node
        if node.op_type == op and looked_up(node) in params and not carries_data(node.input[1])
    )
