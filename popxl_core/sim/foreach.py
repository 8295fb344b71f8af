"""Multi-tensor kernels: same-kind elementwise ops of many tensors as one ``torch._foreach_*``.

An optimizer step is the same few elementwise ops for every parameter (SGD's scaled adds,
Adam's lerp, square, sqrt, divide and update). Like ``torch.optim(..., foreach=True)``, the
compiler runs each kind once over the list of all parameters instead of once per parameter.
The foreach kernels apply the same ATen op to each tensor (CPU runs them tensor by tensor), so
every element is computed with the same arithmetic as the single-tensor op: results are equal
to the bit (tests compare with the reference interpreter). On CPU the gain is Python dispatch
(and reading a shared scalar once per group instead of once per tensor). By default
(`compile.Program(foreach_fresh=True)`) ops that allocate their results group too, as
``torch.optim(..., foreach=True)`` does: all of Adam's chain. With ``foreach_fresh=False`` only
ops that update in place or write into a dead input group (SGD's updates, and Adam's lerp_ and
addcmul_), so that each tensor's chain reuses the previous one's dead temporaries. Which is
faster depends on how many temporaries the chain makes: for popxl_fx's Adam written with
torch's lerp_/addcmul_/addcdiv_ (one temporary per parameter) grouping everything measured
faster (seed MLP batch 8, CPU time: 0.92-0.96 of eager Adam against 1.01-1.08); for the older
11-op Adam the per-tensor chains were (benchmarks/RESULTS.md). The SGD, GPT and resnet
programs of the benchmarks compile the same in both modes.

The pass reorders the live schedule: a topological sort over data dependencies and storage
hazards (reads and in-place writes, through views and in-place outputs to the storage they
share) that takes ops in their original order, except that when it takes an op of a groupable
kind it also takes every other op of the same kind that is ready then. Ops with called graphs,
side effects or custom emitters (IO, collectives, remote buffers) are barriers nothing moves
across. Groups are formed over op types and their operand roles, so any sequence of these ops
(popxl_fx's optimizers, addons' var-updates) groups without knowing the optimizer.

The graph's ordering constraints (``in_sequence``) are not kept between ops of these kinds:
they order side effects, and the only side effects here are in-place writes, whose hazards the
dependencies keep. A scalar operand is shared when it is the same tensor or a constant of the
same value.

Which ops group, and with which list kernel, each op declares next to its kernel
(``speed.FOREACH``, `popxl_core.ops.forms.Foreach`): elementwise add/sub/mul/div, sqrt, neg,
scaled adds, accumulator updates, lerp_/addcmul_/addcdiv_ (float32, every scalar operand
shared by the group) and torch's fused optimizer steps (any dtype, one call per param group).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

from ..graph import Op
from ..ops.forms import Targets, float32_only
from ..tensor import Tensor
from .speed import FOREACH

__all__ = ["Group", "foreach_schedule", "group_kernel", "group_key", "plan_modes", "root"]


@dataclass
class Group:
    """Ops computed by one multi-tensor kernel, in schedule order.

    ``key``: the op's row (`OpDef`) then its `Foreach.key`. ``mode``: "fresh" (new outputs),
    "in0"/"in1" (written into the dead input of each op that the form's ``targets`` name for
    the mode, as ``out=`` reuse does)."""

    ops: List[Op]
    key: tuple
    mode: str = "fresh"


def group_key(op: Op) -> Optional[tuple]:
    """What ops must share to run as one kernel (its row, then the op's `Foreach.key`); None
    for an op that is never grouped."""
    form = FOREACH.get(op.opdef)
    if form is None or op.called_graphs or not op.outputs:
        return None
    if not form.any_dtype and not float32_only(op):
        return None
    key = form.key(op)
    return None if key is None else (op.opdef, *key)


def _targets(op: Op, key: tuple) -> Targets:
    """(mode, input written) pairs a group of ``op``'s kind may use; empty: always fresh."""
    targets = FOREACH[op.opdef].targets
    return targets(key[1:]) if targets is not None else []


def _writes_inputs(op: Op) -> bool:
    """Ops of this kind may write into dead inputs (else their group allocates: see
    `foreach_schedule`'s ``reusable``)."""
    return FOREACH[op.opdef].targets is not None


def _barrier(op: Op) -> bool:
    return bool(op.called_graphs or op.opdef.side_effect or op.opdef.emit is not None)


def root(t: Tensor) -> Tensor:
    """The tensor whose storage ``t`` shares: through views and in-place outputs."""
    while t.producer is not None:
        op = t.producer
        if op.opdef.view:
            t = op.inputs[0]
        elif op.opdef.inplace and op.outputs and t is op.outputs[0]:
            t = op.inputs[op.opdef.inplace[0]]
        else:
            break
    return t


def _dependencies(ops: List[Op]) -> Dict[Op, set]:
    """op -> ops of ``ops`` that must run before it (data, read/write hazards, barriers)."""
    index = {op: k for k, op in enumerate(ops)}
    preds: Dict[Op, set] = {op: set() for op in ops}
    writer: Dict[Tensor, Op] = {}
    readers: Dict[Tensor, List[Op]] = {}
    last_barrier: Optional[Op] = None
    since_barrier: List[Op] = []
    for op in ops:
        p = preds[op]
        p.update(t.producer for t in op.inputs if t.producer in index)
        if last_barrier is not None:
            p.add(last_barrier)
        if _barrier(op):
            p.update(since_barrier)
            last_barrier, since_barrier = op, []
        since_barrier.append(op)
        reads = {root(t) for t in op.inputs}
        writes = {root(op.inputs[i]) for i in op.modified_inputs()}
        for r in reads:
            if r in writer:
                p.add(writer[r])
        for w in writes:
            if w in writer:
                p.add(writer[w])
            p.update(readers.get(w, ()))
        for r in reads:
            readers.setdefault(r, []).append(op)
        for w in writes:
            writer[w] = op
            readers[w] = [op]
        p.discard(op)
    return preds


def foreach_schedule(ops: List[Op], reusable=None) -> Tuple[List[Op], List[Group]]:
    """``ops`` (a live schedule) reordered so that each group's ops are adjacent, and the
    groups of two or more ops. With ``reusable`` (`inplace.reusable_in` of ``ops``), an
    add/sub/mul/div/sqrt joins a group only if it could write into a dead input: a group of
    fresh results allocates every tensor's result at once (as torch.optim's foreach path
    does), where one op at a time reuses the previous tensor's dead temporaries. The compiler
    passes ``reusable`` when its ``foreach_fresh`` option is off (see the module docstring)."""
    keys = _group_keys(ops, reusable)
    if not _repeated(keys):
        return list(ops), []
    order, groups = _ReadyQueue(ops, _dependencies(ops), keys).drain()
    if len(order) != len(ops):
        raise RuntimeError("foreach_schedule: dependency cycle (a bug in the pass).")
    return order, groups


def _repeated(keys: Dict[Op, Optional[tuple]]) -> bool:
    """Some group key is shared by two ops. Else no group can form and the sort returns
    ``ops`` as they are: every dependency points forward in ``ops`` (a live schedule), so the
    op of the smallest index left is always ready, and the queue takes ops by index."""
    seen: set = set()
    for key in keys.values():
        if key is not None:
            if key in seen:
                return True
            seen.add(key)
    return False


def _group_keys(ops: List[Op], reusable) -> Dict[Op, Optional[tuple]]:
    """Each op's group key; with ``reusable``, None for an op that may write into a dead
    input but has none to write into here."""
    keys = {op: group_key(op) for op in ops}
    if reusable is not None:
        for k, op in enumerate(ops):
            key = keys[op]
            if key is not None and _writes_inputs(op):
                if not any(reusable(op.inputs[i], op, k) for _, i in _targets(op, key)):
                    keys[op] = None
    return keys


class _ReadyQueue:
    """A topological sort that takes ops in their original order, except that taking an op
    of a group key takes every other ready op of that key with it."""

    def __init__(self, ops: List[Op], preds: Dict[Op, set], keys) -> None:
        self.index = {op: k for k, op in enumerate(ops)}
        self.keys = keys
        self.succs: Dict[Op, List[Op]] = {op: [] for op in ops}
        for op, ps in preds.items():
            for q in ps:
                self.succs[q].append(op)
        self.waiting = {op: len(p) for op, p in preds.items()}
        self.ready: List[Tuple[int, int, Op]] = []
        self.ready_by_key: Dict[tuple, Dict[Op, None]] = {}
        self.done: set = set()
        for op in ops:
            if self.waiting[op] == 0:
                self._make_ready(op)

    def _make_ready(self, op: Op) -> None:
        heapq.heappush(self.ready, (self.index[op], op.id, op))
        if self.keys[op] is not None:
            self.ready_by_key.setdefault(self.keys[op], {})[op] = None

    def _take(self, op: Op) -> List[Op]:
        """``op`` and the ready ops of its key, in schedule order, up to `FRESH_CAP` bytes of
        new results (the rest stay ready, for a later group)."""
        key = self.keys[op]
        if key is None:
            return [op]
        taken = sorted(self.ready_by_key.pop(key), key=self.index.__getitem__)
        n = _within_cap(taken)
        if n < len(taken):
            self.ready_by_key[key] = dict.fromkeys(taken[n:])
        return taken[:n]

    def drain(self) -> Tuple[List[Op], List[Group]]:
        order: List[Op] = []
        groups: List[Group] = []
        while self.ready:
            op = heapq.heappop(self.ready)[2]
            if op in self.done:
                continue
            taken = self._take(op)
            if len(taken) > 1:
                groups.append(Group(taken, self.keys[op]))
            self.done.update(taken)
            order.extend(taken)
            for t in taken:
                for s in self.succs[t]:
                    self.waiting[s] -= 1
                    if self.waiting[s] == 0:
                        self._make_ready(s)
        return order, groups


# Bytes of new results one group may allocate at once. A group of ops that allocate (Adam's
# sqrt and divide) holds every tensor's result together, where eager's optimizers on CPU (no
# foreach there) hold one parameter's at a time: over all the weights of a large model that
# was a weight-sized copy at the step's peak (issue 38). Chunks of 16 MiB keep the grouping's
# gain (one call per chunk, not per tensor) for everything but the largest models.
FRESH_CAP = 16 << 20


def _within_cap(ops: List[Op]) -> int:
    """How many of ``ops`` (one group key) make one group: all when they update in place,
    else as many as allocate at most `FRESH_CAP` bytes (at least one)."""
    if ops[0].modified_inputs():
        return len(ops)
    total = 0
    for k, op in enumerate(ops):
        total += sum(t.nelms * t.dtype.itemsize for t in op.outputs)
        if total > FRESH_CAP and k > 0:
            return k
    return len(ops)


# kernels ------------------------------------------------------------------------------
def group_kernel(group: Group) -> Callable:
    """``(*inputs of every op, flattened) -> (output of every op)`` for ``group``: the list
    kernel its ops declare (`Foreach.kernel`)."""
    op0 = group.ops[0]
    return FOREACH[op0.opdef].kernel(group.ops, group.key[1:], group.mode)


def plan_modes(
    groups: List[Group], order: List[Op], reusable, keep_fresh: bool = False
) -> Tuple[Dict[Op, Optional[Tensor]], List[Group]]:
    """Decide each group's mode on the final ``order``; returns op -> the input it writes,
    for the ``out=`` reuse planner, and the groups kept: an add/sub/mul/div/sqrt group that
    cannot write into dead inputs is left to run op by op (see `foreach_schedule`).
    ``reusable(t, op, k)`` says whether op (at position k of ``order``) may overwrite ``t``."""
    pos = {op: k for k, op in enumerate(order)}
    fixed: Dict[Op, Optional[Tensor]] = {}
    kept: List[Group] = []
    for grp in groups:
        if _writes_inputs(grp.ops[0]):
            grp.mode = _mode(grp, pos, reusable)
            if grp.mode == "fresh" and not keep_fresh:
                continue
            for op in grp.ops:
                fixed[op] = _written_input(grp, op)
        kept.append(grp)
    return fixed, kept


def _mode(grp: Group, pos, reusable) -> str:
    """ "in0": into the per-tensor operand (input 0, or 1 when a scalar comes first); "in1":
    into input 1 of a commutative op of two tensors; else "fresh"."""
    for mode, i in _targets(grp.ops[0], grp.key):
        if all(reusable(op.inputs[i], op, pos[op]) for op in grp.ops):
            return mode
    return "fresh"


def _written_input(grp: Group, op: Op) -> Optional[Tensor]:
    if grp.mode == "fresh":
        return None
    return op.inputs[dict(_targets(op, grp.key))[grp.mode]]
