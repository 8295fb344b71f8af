"""Remote loads that may be views of their Streaming Memory entry instead of copies.

A phased step loads each phase's weights and optimizer state (``remote_load``: a copy of the
entry), updates them in place and stores them back (``remote_store``: a copy into the
entry); with a remote variable whose buffer is the torch tensor (`RemoteState.share`) the
phase's loads were a second copy of the phase's weights and state at the step's peak. Where
nothing can tell the difference, the load is the entry itself (a view), as eager's optimizer
updates its parameters and state in place:

* read only: the loaded value (and everything that may alias it) is never written, and the
  entry is stored to only after its last read;
* load, update, store back: the first later access to the entry stores the loaded tensor
  itself (or an in-place update of it), every write to it comes before that store, and any
  later store to the entry comes after its last read.

Decided once, in the main graph of a one-replica program, on the emitted order (a
multi-tensor group runs at its first op). The compiler never writes an op's result into a
loaded tensor's storage (`inplace._owned`: only temporaries its graph made by a kernel).
"""

from __future__ import annotations

import heapq
from typing import Dict, List, Optional, Set, Tuple

from ..graph import Op
from ..ops.remote import REMOTE_LOAD, REMOTE_LOAD_INPLACE, REMOTE_STORE
from ..tensor import Constant, Tensor
from .passes import GraphPlan

__all__ = ["view_loads"]

_ACCESS = {REMOTE_LOAD: 0, REMOTE_LOAD_INPLACE: 1, REMOTE_STORE: 1}  # op -> its offset input


def view_loads(plan: GraphPlan) -> Set[Op]:
    """The ``remote_load`` ops of ``plan`` that may return a view of their entry."""
    at = _emitted_at(plan)
    accesses = _accesses(plan.live, at)
    outputs = set(plan.graph._outputs)
    readers = _readers(plan.live)
    return {
        op
        for op in plan.live
        if op.opdef is REMOTE_LOAD and _viewable(op, plan.live, at, accesses, outputs, readers)
    }


def _readers(live: List[Op]) -> Dict[Tensor, List[int]]:
    """Tensor -> the indices in ``live`` of the ops that read it: each load's aliases are
    followed from its readers, not found by scanning every op per load (which was quadratic
    in the program: a phased step's loads times its ops)."""
    out: Dict[Tensor, List[int]] = {}
    for k, op in enumerate(live):
        for t in dict.fromkeys(op.inputs):
            out.setdefault(t, []).append(k)
    return out


def _emitted_at(plan: GraphPlan) -> Dict[Op, int]:
    """Op -> the index in ``plan.live`` of the op whose code computes it."""
    at = {op: k for k, op in enumerate(plan.live)}
    for grp in plan.groups:
        for op in grp.ops[1:]:
            at[op] = at[grp.ops[0]]
    for other, site in plan.computed_at().items():
        at[other] = at[site]
    return at


def _entry(op: Op) -> Tuple[object, Optional[int]]:
    """(buffer, offset) an access reads or writes; offset None: not known before the run."""
    off = op.inputs[_ACCESS[op.opdef]]
    return op.attrs["buffer"], int(off._data) if isinstance(off, Constant) else None


def _accesses(live: List[Op], at: Dict[Op, int]) -> Dict[object, List[Tuple[int, Op]]]:
    """Buffer -> its accesses in emitted order."""
    out: Dict[object, List[Tuple[int, Op]]] = {}
    for op in live:
        if op.opdef in _ACCESS:
            out.setdefault(op.attrs["buffer"], []).append((at[op], op))
    for found in out.values():
        found.sort(key=lambda a: a[0])
    return out


def _aliases(
    v: Tensor, live: List[Op], readers: Dict[Tensor, List[int]]
) -> Tuple[Set[Tensor], Set[Tensor]]:
    """(the tensors that are ``v``'s whole storage: ``v`` and in-place updates of it, every
    tensor that may share its storage). A call or a custom-emitted op may return what it
    was given; a view op views its input 0; any other kernel returns new tensors. The ops
    are taken in ``live`` order, each once it reads a tensor found before it."""
    whole, every = {v}, {v}
    todo = list(readers.get(v, ()))
    heapq.heapify(todo)
    queued = set(todo)
    while todo:
        k = heapq.heappop(todo)
        for t in _alias_step(live[k], whole, every):
            later = [j for j in readers.get(t, ()) if j > k and j not in queued]
            queued.update(later)
            for j in later:
                heapq.heappush(todo, j)
    return whole, every


def _alias_step(op: Op, whole: Set[Tensor], every: Set[Tensor]) -> List[Tensor]:
    """Add what ``op`` (which reads a tensor of ``every``) makes alias it; returns the
    tensors new to ``every``."""
    written = [op.inputs[i] for i in sorted(op.modified_inputs())]
    if op.opdef.inplace and written and written[0] in every:
        if written[0] in whole:
            whole.add(op.outputs[0])
        added = [op.outputs[0]]
    elif op.called_graphs or op.opdef.emit is not None:
        added = list(op.outputs)
    elif op.opdef.view and op.inputs[0] in every:
        added = list(op.outputs)
    else:
        return []
    new = [t for t in dict.fromkeys(added) if t not in every]
    every.update(new)
    return new


def _viewable(load: Op, live: List[Op], at, accesses, outputs, readers) -> bool:
    buffer, offset = _entry(load)
    if offset is None:
        return False
    whole, every = _aliases(load.outputs[0], live, readers)
    if every & outputs:
        return False
    reading = [live[k] for k in sorted({k for t in every for k in readers.get(t, ())})]
    last = max((at[op] for op in reading), default=at[load])
    writes = [at[op] for op in reading if any(op.inputs[i] in every for i in op.modified_inputs())]
    later = [
        (k, op) for k, op in accesses[buffer] if k > at[load] and _entry(op)[1] in (offset, None)
    ]
    stores = [k for k, op in later if op.opdef is REMOTE_STORE]
    if not writes:  # read only: the entry keeps the loaded value while it is read
        return all(k > last for k in stores)
    if not later or later[0][1].opdef is not REMOTE_STORE or later[0][1].inputs[0] not in whole:
        return False
    back = later[0][0]  # stored back: the entry and the tensor agree again from here
    return all(k < back for k in writes) and all(k > last for k in stores[1:])
