"""Edits of existing call sites, for transforms that thread tensors into subgraphs
(popxl.addons' `route_tensor_into_graph`)."""

from __future__ import annotations

from typing import List

from .graph import Graph, Op
from .tensor import Tensor

__all__ = ["call_sites", "append_call_input"]

_CALLING_OPS = ("Call", "Loop")


def call_sites(graph: Graph) -> List[Op]:
    """Every Call and Loop (repeat) op of ``graph``'s Ir that calls ``graph``."""
    return [
        op
        for g in graph.ir._graphs.values()
        for op in g._ops
        if op.type in _CALLING_OPS and graph in op.called_graphs
    ]


def append_call_input(op: Op, parent: Tensor, graph_input: Tensor, modified: bool = False) -> None:
    """Feed ``parent`` (a tensor of ``op``'s graph) to ``graph_input``, the last input of the
    called graph. For a Loop it is a non-carried input: the same value every iteration.
    ``modified``: the called graph writes ``parent`` (passed by reference)."""
    g = op.called_graphs[0]
    if not g._inputs or g._inputs[-1] is not graph_input:
        raise ValueError(
            f"{graph_input.id!r} must be the last input of {g.id!r} to be fed by {op.type}.{op.id}."
        )
    if parent.graph is not op.graph:
        raise ValueError(
            f"{parent.id!r} is not in {op.graph.id!r}, the graph of {op.type}.{op.id}."
        )
    if len(op.inputs) != len(g._inputs) - 1:
        raise ValueError(
            f"{op.type}.{op.id} feeds {len(op.inputs)} of the "
            f"{len(g._inputs) - 1} earlier inputs of {g.id!r}."
        )
    op.graph.ir._check_editable(f"adding an input to {op.type}.{op.id}")
    op.inputs.append(parent)
    op.graph._consumers.setdefault(parent.id, []).append(op)
    if modified:
        op.by_ref_modified.add(len(op.inputs) - 1)
