"""Ordering blocks of ops that a transform made, as PopXL orders a sequence of calls.

popxl.addons' pipelining calls one subgraph per stage and time step inside
``popxl.in_sequence()``, so every call runs after the one before it while the ops inside a
stage keep only the user's own order. addons' `pipelined_execution` here copies the stage ops
into one graph instead; `order_blocks` gives those copies the same order: between ops of
different blocks that use one storage with a write among them, a topological constraint in
creation order. Within a block nothing is added, so an unordered in-place write of the user's
is still refused by the inplacing ambiguity check (`popxl_core.sim.ambiguity`).
"""

from __future__ import annotations

from typing import Dict, Hashable, Iterable, List, Tuple

from .graph import Graph, Op
from .tensor import Tensor

__all__ = ["order_blocks", "constraints_among", "add_constraints"]


def order_blocks(graph: Graph, block_of: Dict[Op, Hashable]) -> None:
    """Order ``graph``'s ops in ``block_of`` (op -> its block) across blocks, in creation
    order, wherever two of them use one storage and one of them writes it. Other ops of
    ``graph`` are left as they are."""
    root: Dict[Tensor, Tensor] = {}
    writes: Dict[Tensor, List[Op]] = {}
    reads: Dict[Tensor, List[Op]] = {}
    for op in [op for op in graph.ops if op in block_of]:
        written = {root.get(op.inputs[i], op.inputs[i]) for i in op.modified_inputs()}
        for r in dict.fromkeys(root.get(t, t) for t in op.inputs):
            earlier = writes.get(r, []) + (reads.get(r, []) if r in written else [])
            for b in earlier:
                if block_of[b] != block_of[op]:
                    graph._add_topocon(b, op)
            if r in written:
                writes[r], reads[r] = [op], []
            else:
                reads.setdefault(r, []).append(op)
        _follow_alias(op, root)


def _follow_alias(op: Op, root: Dict[Tensor, Tensor]) -> None:
    """An in-place op's or a view's output shares its input's storage (as sim/ambiguity)."""
    src = op.aliased_input()
    if src is not None and op.outputs:
        root[op.outputs[0]] = root.get(src, src)


def constraints_among(graph: Graph, ops: Iterable[Op]) -> List[Tuple[Op, Op]]:
    """The topological constraints of ``graph`` (``popxl.in_sequence``) between two of
    ``ops``, as (before, after) pairs."""
    among = set(ops)
    return [(a, b) for a, b in graph._topocons if a in among and b in among]


def add_constraints(graph: Graph, pairs: Iterable[Tuple[Op, Op]]) -> None:
    """Add (before, after) topological constraints between ops of ``graph``."""
    for a, b in pairs:
        graph._add_topocon(a, b)
