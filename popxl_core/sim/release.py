"""Where the generated code drops each temporary: after the last op that reads it.

A name in the generated function otherwise keeps its tensor alive until the graph returns, so
every temporary of a step is a new allocation and the whole step's working set is freed at
once at the end (for a training step, tens of MB handed back to the OS and faulted in again
next step). Eager PyTorch frees a temporary when its last reference goes; ``del`` after the
last reader (decided once, at compile time, like torch.fx's generated code) does the same.
Deleting a name only drops a reference: a view or an alias elsewhere keeps the storage alive.
"""

from __future__ import annotations

from typing import Dict, List

from ..graph import Graph, Op
from ..tensor import Constant, Tensor, Variable

__all__ = ["release_points"]


def release_points(
    live: List[Op], groups, computed_at: Dict[Op, Op], reuse: Dict[Op, Tensor], g: Graph
) -> Dict[int, List[Tensor]]:
    """Index in ``live`` of the emitting op -> tensors no later emitted op reads. Ops of a
    group are emitted at its first op, an op a fused kernel computes at the op
    ``computed_at`` names (a MatMul at its Transpose, a Conv's gradients at the first); an
    op writing into a dead temporary (``reuse``) reads that temporary's name."""
    at: Dict[Op, int] = {op: k for k, op in enumerate(live)}
    for grp in groups:
        for op in grp.ops[1:]:
            at[op] = at[grp.ops[0]]
    for op, site in computed_at.items():
        at[op] = at[site]
    last: Dict[Tensor, int] = {}
    for op in live:
        for t in op.outputs:
            last.setdefault(t, at[op])  # produced and never read: dropped at once
        for t in op.inputs:
            last[t] = max(last.get(t, -1), at[op])
    for op, storage in reuse.items():
        last[storage] = max(last.get(storage, -1), at[op])
    keep = set(g._outputs)
    out: Dict[int, List[Tensor]] = {}
    for t, k in last.items():
        if t not in keep and not isinstance(t, (Constant, Variable)):
            out.setdefault(k, []).append(t)
    return out
