"""Graph helpers of popxl.addons: `is_subgraph`, `route_tensor_into_graph`, `seed_variable`."""

from __future__ import annotations

import weakref

import numpy as np

import popxl_core
from popxl_core import Graph, ReplicaGrouping, Tensor, Variable
from popxl_core.graph_edit import append_call_input, call_sites

__all__ = ["is_subgraph", "route_tensor_into_graph", "seed_variable"]

# graph -> {parent tensor: the graph input it was routed to}, so routing twice reuses one input
_ROUTED: weakref.WeakKeyDictionary[Graph, dict[Tensor, Tensor]] = weakref.WeakKeyDictionary()


def is_subgraph(parent: Graph, subgraph: Graph) -> bool:
    """True if ``parent`` calls ``subgraph``, directly or through graphs it calls.

    >>> ir = popxl_core.Ir()
    >>> sg = ir.create_empty_graph("sg")
    >>> with ir.main_graph:
    ...     _ = popxl_core.ops.call(sg)
    >>> is_subgraph(ir.main_graph, sg), is_subgraph(sg, ir.main_graph)
    (True, False)
    """
    seen: set[Graph] = set()
    todo = list(parent.called_graphs)
    while todo:
        g = todo.pop()
        if g == subgraph:
            return True
        if g not in seen:
            seen.add(g)
            todo.extend(g.called_graphs)
    return False


def route_tensor_into_graph(
    tensor: Tensor, graph: Graph | None = None, modified: bool = False
) -> Tensor:
    """``tensor`` of an enclosing graph as a tensor of ``graph`` (default: the current one).

    A new input of ``graph`` is fed with ``tensor`` at every call site (Call and repeat ops),
    routing it through every graph on the way, once per graph however often it is asked for.
    ``modified`` marks the inputs as written by the called graphs.

    >>> ir = popxl_core.Ir()
    >>> sg = ir.create_empty_graph("sg")
    >>> with ir.main_graph:
    ...     a = popxl_core.variable(1.0, name="a")
    ...     _ = popxl_core.ops.call(sg)
    >>> with sg:
    ...     b = route_tensor_into_graph(a)
    >>> b in sg.inputs, route_tensor_into_graph(a, sg) is b
    (True, True)
    """
    return _route(tensor, graph or popxl_core.gcg(), modified, frozenset())


def _route(t: Tensor, graph: Graph, modified: bool, visiting: frozenset) -> Tensor:
    if t.graph is graph:
        return t
    routed = _ROUTED.setdefault(graph, {})
    if t in routed:
        return routed[t]
    sites = call_sites(graph)
    if not sites or graph in visiting:
        src, dst = t.graph.id or "main", graph.id
        raise ValueError(
            f"Tensor {t.id!r} is not in the graph {dst!r}, and {dst!r} is not in a known parent "
            f"graph: no call site leads from {src!r} to it. Call {dst!r} (ops.call / "
            "ops.repeat) before routing into it."
        )
    parents = [(op, _route(t, op.graph, modified, visiting | {graph})) for op in sites]
    with graph:
        new = popxl_core.graph_input(
            t.shape, t.dtype, t.name, by_ref=modified, meta_shape=t.meta_shape or None
        )
    for op, parent in parents:
        append_call_input(op, parent, new, modified)
    routed[t] = new
    return new


def seed_variable(
    seed: int, replica_grouping: ReplicaGrouping | None = None
) -> tuple[Variable, Tensor]:
    """A uint32 seed variable (shape (2,)) with one value per replica group, and its tensor.

    The seeds come from `popxl.create_seeds(seed, replicas=num_groups)`, so replicas of a
    group share a seed (e.g. tensor-parallel replicas that must drop out the same values).
    The returned tensor is the variable's value, as popxl.addons returns it.
    """
    ir = popxl_core.gcg().ir
    group = replica_grouping or ir.replica_grouping()
    seeds = popxl_core.create_seeds(seed, replicas=group.num_groups)
    data = np.reshape(seeds, (group.num_groups, 2) if group.num_groups > 1 else (2,))
    seed_v = popxl_core.variable(data, popxl_core.uint32, "seed", replica_grouping=group)
    return seed_v, seed_v
