"""Op schedules: data dependencies and topological constraints, creation order otherwise."""

from __future__ import annotations

import heapq
from typing import Dict, List

from .graph import Graph, Op

__all__ = ["schedule", "verify"]


def schedule(graph: Graph) -> List[Op]:
    """The order ops run in: a topological order that keeps creation order where it can.

    Compiling and planning a program ask for the same graph's order about ten times, so the
    last order is kept on the graph with a fingerprint of everything the order depends on
    (the op list, the topological constraints, each op's inputs); any change to those, in
    place or by reassignment, misses the cache. A tensor's producer is fixed when it is made.
    """
    key = _fingerprint(graph)
    cached = getattr(graph, "_schedule_cache", None)
    if cached is not None and cached[0] == key:
        return list(cached[1])
    order = _schedule(graph)
    graph._schedule_cache = (key, tuple(order))
    return order


def _fingerprint(graph: Graph) -> tuple:
    """What `schedule` reads, as tuples compared by identity first (cheap when unchanged)."""
    ops = tuple(graph._ops)
    return ops, tuple(graph._topocons), tuple([tuple(op.inputs) for op in ops])


def _schedule(graph: Graph) -> List[Op]:
    position = {op: i for i, op in enumerate(graph._ops)}
    preds: Dict[Op, set] = {op: set() for op in graph._ops}
    for op in graph._ops:
        for t in op.inputs:
            if t.producer is not None and t.producer in preds:
                preds[op].add(t.producer)
    for before, after in graph._topocons:
        if before in preds and after in preds:
            preds[after].add(before)
    return _kahn(graph._ops, preds, position, graph)


def _kahn(ops: List[Op], preds: Dict[Op, set], position: Dict[Op, int], graph: Graph) -> List[Op]:
    succs: Dict[Op, List[Op]] = {op: [] for op in ops}
    waiting = {op: len(p) for op, p in preds.items()}
    for op, ps in preds.items():
        for p in ps:
            succs[p].append(op)
    ready = [(position[op], op.id, op) for op in ops if waiting[op] == 0]
    heapq.heapify(ready)
    order: List[Op] = []
    while ready:
        _, _, op = heapq.heappop(ready)
        order.append(op)
        for s in succs[op]:
            waiting[s] -= 1
            if waiting[s] == 0:
                heapq.heappush(ready, (position[s], s.id, s))
    if len(order) != len(ops):
        stuck = [f"{op.type}.{op.id}" for op in ops if op not in set(order)]
        raise RuntimeError(f"Graph {graph.name!r} has a cycle of dependencies among {stuck}.")
    return order


def verify(graph: Graph) -> None:
    """Check the IR invariants of ``graph``; raise AssertionError naming the first broken one."""
    owned = set(graph._tensors.values())
    for t in graph._inputs + graph._outputs:
        assert t in owned, f"{graph.name}: input/output {t.id} is not a tensor of the graph"
    seen = set(graph._inputs)
    seen |= {t for t in owned if t.producer is None}
    for op in schedule(graph):
        assert op.graph is graph, f"{op!r} is listed in {graph.name} but belongs elsewhere"
        for t in op.inputs:
            assert t in owned, f"{op!r} reads {t.id}, which is not in {graph.name}"
            assert t in seen, f"{op!r} reads {t.id} before it is produced"
        for t in op.outputs:
            assert t.producer is op, f"{t.id} does not name {op!r} as its producer"
            seen.add(t)
    for t in graph._outputs:
        assert t in seen, f"{graph.name}: output {t.id} is never produced"
