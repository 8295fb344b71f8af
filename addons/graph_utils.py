"""Graph helpers of popxl.addons: `is_subgraph` and `seed_variable`."""

from __future__ import annotations

import numpy as np

import popxl_core
from popxl_core import Graph, ReplicaGrouping, Tensor, Variable

__all__ = ["is_subgraph", "seed_variable"]


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
