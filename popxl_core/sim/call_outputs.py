"""Subgraph outputs that no call site reads, which the compiled subgraph then does not compute.

Autodiff returns a gradient for every input it was asked for, and a program often drops some:
seed 001's backward graph computes the first layer's input gradient, an (8, 512) @ (512, 784)
product (a ninth of the step's arithmetic), which the main graph never reads; eager PyTorch
skips it because the images do not require grad. A subgraph called only by ``Call`` ops (not
by a loop or a conditional, whose outputs are carried or selected) returns ``None`` in place
of every output that no call site reads, and the ops that only fed those outputs are dropped
like any dead op. The caller's liveness decides what it reads, so the pruning passes down
nested calls: callers are analysed before the graphs they call.
"""

from __future__ import annotations

from typing import Dict, FrozenSet, List, Set

from ..graph import Graph, Op
from ..ops.call import CALL

__all__ = ["kept_outputs"]


def _callers(graphs: List[Graph]) -> Dict[Graph, List[Op]]:
    sites: Dict[Graph, List[Op]] = {}
    for g in graphs:
        for op in g._ops:
            for c in op.called_graphs:
                sites.setdefault(c, []).append(op)
    return sites


def _callers_first(main: Graph) -> List[Graph]:
    """Every graph reachable from ``main``, each after all graphs that call it."""
    order: List[Graph] = []
    seen: Set[Graph] = set()

    def visit(g: Graph) -> None:
        if g in seen:
            return
        seen.add(g)
        for op in g._ops:
            for c in op.called_graphs:
                visit(c)
        order.append(g)

    visit(main)
    return order[::-1]


def _reads(g: Graph, kept: FrozenSet[int], live_ops) -> Set[object]:
    outputs = [t for i, t in enumerate(g._outputs) if i in kept]
    read: Set[object] = set(outputs)
    for op in live_ops(g, outputs):
        read.update(op.inputs)
    return read


def kept_outputs(main: Graph, live_ops) -> Dict[Graph, FrozenSet[int]]:
    """Graph -> the indexes of its outputs some caller reads (main: all of them).

    ``live_ops(g, outputs)``: g's ops that are live when only ``outputs`` are returned."""
    order = _callers_first(main)
    sites = _callers(order)
    kept: Dict[Graph, FrozenSet[int]] = {}
    read_by_callers: Dict[Graph, Set[int]] = {}
    for g in order:
        everything = frozenset(range(len(g._outputs)))
        only_calls = g is not main and all(op.opdef is CALL for op in sites.get(g, ()))
        kept[g] = frozenset(read_by_callers.get(g, ())) if only_calls else everything
        read = _reads(g, kept[g], live_ops)
        for op in g._ops:
            if op.opdef is CALL:
                used = {i for i, t in enumerate(op.outputs) if t in read}
                read_by_callers.setdefault(op.called_graphs[0], set()).update(used)
    return kept
