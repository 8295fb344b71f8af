"""PopART's inplacing ambiguity check, made when a Session is built if the session option
``enableInplaceAmbiguityChecking`` is True (PopXL turns it on for every Ir, and so does
`popxl_core.pb_ir`; a script may turn it off).

An op that writes a tensor in place (``relu_``, ``+=``, a var update) and another op that reads
or writes the same storage, with neither ordered before the other by data or by topological
constraints (``popxl.in_sequence``), give a result that depends on the order the scheduler
picks. PopART refuses such a program ("Inplacing ambiguity detected."), including the cases its
checker cannot tell apart from real ones (two ``relu_`` of one tensor, a read then a full
overwrite); so does this check. The simulator itself runs ops in creation order, so the check
changes no number: it refuses what PopXL refuses.

Storage is followed through view ops and in-place outputs within a graph; a call reads its
inputs (what its subgraph writes is checked in that subgraph).
"""

from __future__ import annotations

from typing import Dict, List

from ..graph import Graph, Op
from ..schedule import schedule
from ..tensor import Tensor

__all__ = ["InplaceAmbiguityError", "check_inplace_ambiguity"]


class InplaceAmbiguityError(RuntimeError):
    """PopART's ``popart_exception`` for an ambiguous in-place program."""


def check_inplace_ambiguity(ir) -> None:
    """Raise `InplaceAmbiguityError` for the first graph of ``ir`` with an unordered in-place
    write, if the session option asks for the check."""
    if not ir._pb_ir.getSessionOptions().enableInplaceAmbiguityChecking:
        return
    for g in ir.graphs:
        _check_graph(g)


def _storage(ops: List[Op]) -> Dict[Tensor, Tensor]:
    """Each tensor that shares storage with another -> the first tensor of that storage."""
    root: Dict[Tensor, Tensor] = {}
    for op in ops:
        src = op.aliased_input()
        if src is not None:
            root[op.outputs[0]] = root.get(src, src)
    return root


def _before(g: Graph, order: List[Op], pos: Dict[Op, int]) -> Dict[Op, int]:
    """Op -> a bit set (an int over the positions ``pos`` gives the ops the check compares) of
    those ordered before it. Only those ops have a bit, so a large graph with few in-place
    writes needs small sets (the order still passes through every op)."""
    after: Dict[Op, List[Op]] = {op: [] for op in order}
    for before, later in g._topocons:
        if before in after and later in after:
            after[later].append(before)
    bits: Dict[Op, int] = {}
    for op in order:
        preds = [t.producer for t in op.inputs if t.producer in after] + after[op]
        acc = 0
        for p in preds:
            acc |= bits[p] | (1 << pos[p] if p in pos else 0)
        bits[op] = acc
    return bits


def _check_graph(g: Graph) -> None:
    order = schedule(g)
    writers = [op for op in order if op.opdef.inplace]
    if not writers:
        return
    root = _storage(order)
    users: Dict[Tensor, List[Op]] = {}
    for op in order:
        if not op.opdef.view or op.opdef.inplace:
            for t in dict.fromkeys(op.inputs):
                users.setdefault(root.get(t, t), []).append(op)
    written = {root.get(t, t) for w in writers for t in (w.inputs[i] for i in w.opdef.inplace)}
    compared = dict.fromkeys(op for t in written for op in users.get(t, ()))
    pos = {op: i for i, op in enumerate(compared)}
    bits = _before(g, order, pos)
    for w in writers:
        for t in {root.get(op_in, op_in) for op_in in (w.inputs[i] for i in w.opdef.inplace)}:
            for other in users.get(t, ()):
                ordered = bits[other] >> pos[w] & 1 or bits[w] >> pos[other] & 1
                if other is not w and not ordered:
                    raise InplaceAmbiguityError(_message(g, w, other, t))


def _message(g: Graph, writer: Op, other: Op, t: Tensor) -> str:
    return (
        f"Inplacing ambiguity detected. In graph {g.name!r}, {writer!r} writes {t.id!r} in "
        f"place and {other!r} also uses it, but neither is ordered before the other, so the "
        "result depends on the schedule. Order them (build them inside `popxl.in_sequence()`, "
        "or make one depend on the other's output), or use the out-of-place op. (The check is "
        "the session option enableInplaceAmbiguityChecking, as in PopART.)"
    )
