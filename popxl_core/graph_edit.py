"""Edits of existing graphs: threading tensors into subgraphs through their call sites
(popxl.addons' `route_tensor_into_graph`) and moving a graph's ops into a new subgraph
(popxl.addons' `repeat_graph`)."""

from __future__ import annotations

from typing import Dict, List, Tuple

from .graph import Graph, Op
from .schedule import schedule
from .tensor import Tensor, graph_input

__all__ = [
    "call_sites",
    "append_call_input",
    "move_ops_into_subgraph",
    "move_ops",
    "remove_ops",
    "remove_outputs",
]

_CALLING_OPS = ("Call", "Loop")


def call_sites(graph: Graph) -> List[Op]:
    """Every Call and Loop (repeat) op of ``graph``'s Ir that calls ``graph``."""
    return [
        op
        for g in graph.ir.graphs
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
    op.graph.ir.check_editable(f"adding an input to {op.type}.{op.id}")
    op.inputs.append(parent)
    op.graph._consumers.setdefault(parent.id, []).append(op)
    if modified:
        op.by_ref_modified.add(len(op.inputs) - 1)


def move_ops_into_subgraph(graph: Graph, name: str) -> Tuple[Graph, Dict[Tensor, Tensor]]:
    """Move every op of ``graph`` (in schedule order, keeping op ids and topological
    constraints) into a new empty subgraph named ``name``.

    Each tensor the ops read but do not produce (graph inputs, variables, constants) becomes
    an input of the subgraph, by reference when an op writes it. Returns the subgraph and
    ``{subgraph input: tensor of graph}`` for its call site. ``graph`` must have no outputs
    (they would be produced inside the subgraph).
    """
    if graph._outputs:
        raise ValueError(
            f"Cannot move the ops of {graph.name or 'the main graph'!r} into a subgraph: it has "
            f"outputs ({[t.id for t in graph._outputs]}), which its ops would no longer produce."
        )
    body, inputs, _ = move_ops(graph, schedule(graph), name)
    return body, inputs


def move_ops(graph: Graph, ops: List[Op], name: str):
    """Move ``ops`` (a subset of ``graph``'s ops, in the order given; ids kept) into a new empty
    subgraph ``name``. Tensors they read from elsewhere become inputs (by reference where
    written). Topological constraints among the moved ops move with them; those between a
    moved and a staying op are dropped (the caller orders the call site).

    Returns ``(subgraph, {subgraph input: outside tensor}, {old tensor: subgraph tensor})``
    for every output of a moved op; the old tensors leave ``graph``, and any op left in
    ``graph`` that read one must be given the call's output instead (the caller's job).
    """
    graph.ir.check_editable(f"moving ops of graph {graph.name or 'main'!r}")
    moved = set(ops)
    body = graph.ir.create_empty_graph(name)
    inputs = _external_inputs(ops, body)
    mapping: Dict[Tensor, Tensor] = {parent: inner for inner, parent in inputs.items()}
    produced: Dict[Tensor, Tensor] = {}
    for op in ops:
        olds = list(op.outputs)
        _move_op(op, body, mapping)
        produced.update(zip(olds, op.outputs))
    body._topocons = [(a, b) for a, b in graph._topocons if a in moved and b in moved]
    graph._topocons = [(a, b) for a, b in graph._topocons if a not in moved and b not in moved]
    graph._ops = [op for op in graph._ops if op not in moved]
    graph._consumers = {}
    for op in graph._ops:
        for t in op.inputs:
            graph._consumers.setdefault(t.id, []).append(op)
    for t in produced:
        graph._tensors.pop(t.id, None)
    return body, inputs, produced


def _external_inputs(order: List[Op], body: Graph) -> Dict[Tensor, Tensor]:
    """A by-value or by-ref input of ``body`` for each tensor ``order`` reads from outside."""
    moved = set(order)
    modified = {op.inputs[i] for op in order for i in op.modified_inputs()}
    out: Dict[Tensor, Tensor] = {}
    seen = set()
    with body:
        for op in order:
            for t in op.inputs:
                if t.producer in moved or t in seen:
                    continue
                seen.add(t)
                inner = graph_input(
                    t.shape, t.dtype, t.name, by_ref=t in modified, meta_shape=t.meta_shape or None
                )
                out[inner] = t
    return out


def _move_op(op: Op, body: Graph, mapping: Dict[Tensor, Tensor]) -> None:
    op.inputs = [mapping[t] for t in op.inputs]
    outs = []
    for t in op.outputs:
        new = Tensor._create(body, body._create_tensor_id(t.name), t.spec, producer=op)
        new._ipu, new._tile_set = t._ipu, t._tile_set
        mapping[t] = new
        outs.append(new)
    op.outputs = outs
    op.graph = body
    body._add_op(op)


def remove_ops(graph: Graph, ops: List[Op]) -> None:
    """Take ``ops`` and the tensors they make out of ``graph`` (addons' pipelining keeps them
    as templates and builds its schedule from copies).

    ValueError if a remaining op or a graph output uses one of their outputs; nothing is
    changed then.
    """
    gone = set(ops)
    made = [t for op in ops for t in op.outputs]
    used = [
        t for t in made if t in graph._outputs or any(c not in gone for c in graph.consumers(t))
    ]
    if used:
        raise ValueError(
            f"remove_ops: {', '.join(repr(t.id) for t in used)} of graph {graph.name!r} are "
            "still used by ops or outputs that stay."
        )
    graph._ops = [op for op in graph._ops if op not in gone]
    graph._topocons = [(a, b) for a, b in graph._topocons if a not in gone and b not in gone]
    graph._consumers = {}
    for op in graph._ops:
        for t in op.inputs:
            graph._consumers.setdefault(t.id, []).append(op)
    for t in made:
        graph._tensors.pop(t.id, None)


def remove_outputs(graph: Graph, outputs: List[Tensor]) -> None:
    """Remove ``outputs`` from ``graph``'s outputs (PopART's ``removeOutput``). Only for a
    graph no call site uses yet: a call op's outputs follow its graph's outputs."""
    for t in outputs:
        if t not in graph._outputs:
            raise ValueError(f"remove_outputs: {t.id!r} is not an output of {graph.name!r}.")
        if call_sites(graph):
            raise ValueError(
                f"remove_outputs: graph {graph.name!r} is already called; remove outputs "
                "before creating its call sites."
            )
        graph._outputs.remove(t)
