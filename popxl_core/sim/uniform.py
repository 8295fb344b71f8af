"""Replica-uniform work, computed once: the optimizer update of data-parallel replicas.

With R replicas every replica runs the same main graph. After an all-reduce over all of them
the reduced gradients are the same bits on every replica, and so are the weights they update
(equal to start with, changed only from equal values): R replicas would make R identical
weight-sized updates (and R copies of each reduced gradient). Here, at Session build, a static
analysis of the main graph finds that work; in a lock-step run (`lockstep.py`) the first
replica (the leader) runs the whole graph on variable storage all replicas share, and the
others (followers) run a second compiled main graph without it.

A tensor is *uniform* when it is a constant, a shared variable, the result of an all-reduce
over all replicas, a load of a small host stream whose data the run checks is equal on every
replica, or the output of a deterministic op (no collective, stream, remote buffer or print;
called graphs alike) whose inputs are all uniform. The leader alone runs the *uniform ops* U:
uniform ops whose outputs only U reads and that write only shared variables or tensors only U
reads. A variable is *shared* when only U writes it (a fixed point with U). Two more rules
keep the followers' reads right:

- the leader of a lock step runs first up to each collective, so a follower reading a shared
  variable must meet the leader's write of it on the same side of a collective as the graph
  says: a read before the write with no collective between them would see the new value
  (`_hazards`; such a variable is not shared);
- every run checks that the shared variables hold the same bits on every replica (they then
  become one tensor) and that the checked streams got the same data for every replica; else
  the run is the unshared one, with each replica's own copies (`SharedRuns.prepare`). A host
  write gives each replica its own copy again (`SharedRuns.unshare`).

Followers' collectives whose results only U reads return nothing (`Runtime.collective`'s
``need``): the reduced gradient is not copied for them. `CompileOptions(share_uniform=False)`
switches it all off; tests compare both, bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, FrozenSet, List, Optional, Set, Tuple

import numpy as np
import torch

from ..graph import Graph, Op
from ..ops.collectives.collectives import group_table
from ..ops.collectives.replicated import ALL_REDUCE, ALL_REDUCE_INPLACE
from ..ops.io import HOST_LOAD
from ..tensor import Constant, Tensor, Variable
from .bits import same_bits
from .passes import GraphPlan

__all__ = ["Sharing", "SharedRuns", "full_all_reduce", "plan_sharing"]

# a host stream of at most this many elements a replica may be checked equal on every run
_SMALL_STREAM = 4096
_ATTEMPTS = 4  # analyses with hazardous variables taken out before giving up


@dataclass(frozen=True)
class Sharing:
    """What the followers skip and the run checks."""

    follow: Callable  # the followers' main function
    ops: FrozenSet[Op]  # U: run by the leader only
    variables: Tuple[int, ...]  # indexes into `Program.variables` of the shared variables
    streams: Tuple[object, ...]  # host streams whose data must be equal on every replica


def plan_sharing(program, main_plan: GraphPlan) -> Optional[Sharing]:
    """The sharing of ``program``'s main graph (None: nothing to share, or switched off).
    Only where its runtime runs several replicas: a folded program's runs all replicas'
    rows as one (`fold.FoldRuntime`), with nothing to share between them."""
    ir = program.ir
    if len(program.namespace["RT"].local) < 2 or not program.options.share_uniform:
        return None
    g = ir.main_graph
    candidates = {v for v in program.variables if _candidate(v)}
    streams = _top_level_streams(ir)
    for _ in range(_ATTEMPTS):
        ops, shared, used_streams = _uniform_ops(main_plan.live, g, candidates, streams, ir)
        if not ops or not shared:
            return None
        follow, plan = program.compile_follower(ops)
        bad = _hazards(main_plan, plan, ops, shared)
        if not bad:
            index = {v: i for i, v in enumerate(program.variables)}
            return Sharing(
                follow, frozenset(ops), tuple(sorted(index[v] for v in shared)), used_streams
            )
        candidates -= bad
    return None


def _candidate(v: Variable) -> bool:
    """A variable that may hold the same value on every replica: one group, not a shard."""
    grouping = getattr(v, "replica_grouping", None)
    groups = grouping.num_groups if grouping is not None else 1
    return groups == 1 and getattr(v, "_shard_of", None) is None


def _top_level_streams(ir) -> Set[Any]:
    """Small host streams loaded only in the main graph (a fixed number of times per run)."""
    where: Dict[Any, Set[Graph]] = {}  # host stream -> the graphs loading it
    for graph in ir._graphs.values():
        for op in graph._ops:
            if op.opdef is HOST_LOAD:
                where.setdefault(op.attrs["stream"], set()).add(graph)
    return {
        s
        for s, graphs in where.items()
        if graphs == {ir.main_graph} and int(np.prod(s.shape)) <= _SMALL_STREAM
    }


# the analysis ---------------------------------------------------------------------------
def _roots(ops: List[Op]) -> Dict[Tensor, Tensor]:
    """Tensor -> the tensor whose storage it is (in-place results and views alias input 0)."""
    root: Dict[Tensor, Tensor] = {}
    for op in ops:
        d = op.opdef
        if op.outputs and (d.inplace or d.view):
            src = op.inputs[d.inplace[0] if d.inplace else 0]
            root[op.outputs[0]] = root.get(src, src)
    return root


def _uniform_ops(ops: List[Op], g: Graph, candidates, streams, ir):
    """(U, shared variables, streams U loads): fixed point over variables written by others."""
    root = _roots(ops)
    readers: Dict[Tensor, List[Op]] = {}
    for op in ops:
        for t in op.inputs:
            readers.setdefault(root.get(t, t), []).append(op)
    tainted: Set[Tensor] = set()  # storage some op outside U writes
    pure: Dict[Graph, bool] = {}
    while True:
        u = _uniform_candidates(ops, root, candidates, tainted, streams, ir, pure)
        u = _own_writes(_closed(u, ops, g), ops, g, root, readers, candidates - tainted)
        written = {
            root.get(op.inputs[i], op.inputs[i])
            for op in ops
            if op not in u
            for i in op.modified_inputs()
        }
        if written <= tainted:
            break
        tainted |= written
    # the variables U writes or reads: one tensor for all replicas (checked equal per run)
    shared = {v for v in candidates - tainted if v in readers and any(x in u for x in readers[v])}
    loaded = tuple(op.attrs["stream"] for op in ops if op in u and op.opdef is HOST_LOAD)
    return u, shared, loaded


def _uniform_candidates(ops, root, candidates, tainted, streams, ir, pure) -> Set[Op]:
    """Ops computing uniform values from uniform values, in schedule order."""
    uniform: Set[Tensor] = set()
    u: Set[Op] = set()

    def is_uniform(t: Tensor) -> bool:
        r = root.get(t, t)
        if r in tainted:
            return False
        return isinstance(t, Constant) or t in uniform or (t is r and t in candidates)

    for op in ops:
        if full_all_reduce(op, ir):
            if root.get(op.outputs[0], op.outputs[0]) not in tainted:
                uniform.update(op.outputs)
        elif op.opdef is HOST_LOAD:
            if op.attrs["stream"] in streams:
                u.add(op)
                uniform.update(op.outputs)
        elif _pure(op, pure) and all(is_uniform(t) for t in op.inputs):
            u.add(op)
            uniform.update(op.outputs)
    return u


def _closed(u: Set[Op], ops: List[Op], g: Graph) -> Set[Op]:
    """The largest part of ``u`` whose outputs only ops of it read (followers need none)."""
    u = {op for op in u if not any(t in g._outputs for t in op.outputs)}
    changed = True
    while changed:
        changed = False
        for op in ops:
            if op not in u:
                for t in op.inputs:
                    if t.producer in u:
                        u.discard(t.producer)
                        changed = True
    return u


def _own_writes(u: Set[Op], ops, g, root, readers, shareable) -> Set[Op]:
    """U without ops writing storage that an op outside U reads, unless it is a variable
    that may be shared (the followers see the leader's write there, `_hazards` checks when)."""
    u = set(u)
    changed = True
    while changed:
        changed = False
        for op in list(u):
            for i in op.modified_inputs():
                r = root.get(op.inputs[i], op.inputs[i])
                if r in shareable:
                    continue
                if any(x not in u for x in readers.get(r, ())):
                    u.discard(op)
                    changed = True
                    break
        u = _closed(u, ops, g)
    return u


def _by_root(ops, root, tensors) -> Dict[Tensor, List[Op]]:
    """Storage root -> the ops (each once, in ``ops``' order) whose ``tensors(op)`` are
    views of it."""
    found: Dict[Tensor, List[Op]] = {}
    for op in ops:
        for r in {root.get(t, t) for t in tensors(op)}:
            found.setdefault(r, []).append(op)
    return found


def full_all_reduce(op: Op, ir) -> bool:
    """An all-reduce over every replica: the same result on each."""
    if op.opdef not in (ALL_REDUCE, ALL_REDUCE_INPLACE):
        return False
    if op.attrs.get("op") == "local":
        return False
    table = group_table(op.attrs.get("group"), ir.replication_factor)
    everyone = tuple(range(ir.replication_factor))
    return all(tuple(m) == everyone for m in table.members)


def _pure(op: Op, memo: Dict[Graph, bool]) -> bool:
    """A deterministic op without effects outside its outputs and inputs: no collective,
    stream, remote buffer, print; its called graphs alike."""
    d = op.opdef
    if d.collective or d.side_effect:
        return False
    if op.called_graphs:
        return all(_pure_graph(c, memo) for c in op.called_graphs)
    return d.emit is None


def _pure_graph(g: Graph, memo: Dict[Graph, bool]) -> bool:
    if g not in memo:
        memo[g] = False  # a recursive call is not pure
        memo[g] = all(_pure(op, memo) for op in g._ops)
    return memo[g]


# when followers read what the leader writes -------------------------------------------
def _positions(plan: GraphPlan) -> Dict[Op, int]:
    """Op -> the index of the op emitting it (groups and fused pairs at one site)."""
    pos = {op: k for k, op in enumerate(plan.live)}
    for other, at in plan.computed_at().items():
        pos[other] = pos[at]
    for grp in plan.groups:
        for op in grp.ops:
            pos[op] = pos[grp.ops[0]]
    return pos


def _segments(plan: GraphPlan, pos: Dict[Op, int]) -> Dict[Op, int]:
    """Op -> how many collectives of the graph run before it."""
    marks = sorted(pos[op] for op in plan.live if op.opdef.collective)
    return {op: int(np.searchsorted(marks, p)) for op, p in pos.items()}


def _hazards(lead: GraphPlan, follow: GraphPlan, u: Set[Op], shared: Set[Variable]):
    """Shared variables a follower would read at the wrong side of the leader's write."""
    root = _roots(lead.live)
    pos_l = _positions(lead)
    seg_l, seg_f = _segments(lead, pos_l), _segments(follow, _positions(follow))
    # writers and readers by the storage they touch, found in one pass each (asking every
    # op about every shared variable was quadratic: ~250k checks in a model test's builds)
    writes_of = _by_root(u, root, lambda op: [op.inputs[i] for i in op.modified_inputs()])
    reads_of = _by_root([r for r in follow.live if r not in u], root, lambda op: op.inputs)
    bad = set()
    for v in shared:
        for r in reads_of.get(v, ()):
            for w in writes_of.get(v, ()):
                before = pos_l[r] < pos_l[w]
                if pos_l[r] == pos_l[w] or (seg_f[r] < seg_l[w]) != before:
                    bad.add(v)
    return bad


# at run time ----------------------------------------------------------------------------
class SharedRuns:
    """Per run: whether this run shares (and the replicas' variable lists made so)."""

    def __init__(self, sharing: Optional[Sharing]) -> None:
        self.sharing = sharing
        self.active = False  # the replicas' lists hold one tensor per shared variable

    def prepare(self, device: Dict[int, List[torch.Tensor]], feeds, in_order: bool):
        """The followers' function for this run, or None (every replica runs main)."""
        s = self.sharing
        ok = (
            s is not None
            and in_order
            and all(_same_replicas(feeds[st]) for st in s.streams if st in feeds)
            and self._share(device)
        )
        if not ok or s is None:  # (ok is False without s)
            self.unshare(device)
            return None
        return s.follow

    def _share(self, device: Dict[int, List[torch.Tensor]]) -> bool:
        """Make the shared variables one tensor, if their bits are equal on every replica."""
        if self.active:
            return True
        assert self.sharing is not None  # `prepare` asks only with a sharing plan
        lead, *others = (device[r] for r in sorted(device))
        for i in self.sharing.variables:
            if not all(same_bits(lead[i], rep[i]) for rep in others):
                return False
        for rep in others:
            for i in self.sharing.variables:
                rep[i] = lead[i]
        self.active = True
        return True

    def adopt(self, device: Dict[int, List[torch.Tensor]], i: int, tensor: torch.Tensor) -> bool:
        """Where the replicas share variable ``i`` now: ``tensor`` becomes its one value on
        every replica (True), as `_share` would make copies of it at the next run, without
        the copies and their bit check (the sharing stays active; a later unshared run or
        host write gives each replica its copy, `unshare`). Else False."""
        s = self.sharing
        if not self.active or s is None or i not in s.variables:
            return False
        for rep in device.values():
            rep[i] = tensor
        return True

    def unshare(self, device: Optional[Dict[int, List[torch.Tensor]]]) -> None:
        """Every replica its own copy again (before a host write or an unshared run)."""
        if not self.active or device is None:
            self.active = False
            return
        assert self.sharing is not None  # active only with a sharing plan
        lead, *others = (device[r] for r in sorted(device))
        for rep in others:
            for i in self.sharing.variables:
                if rep[i] is lead[i]:
                    rep[i] = lead[i].clone()
        self.active = False


def _same_replicas(buf: np.ndarray) -> bool:
    """Whether a run's stream data ``[transfers, replicas, ...]`` is the same bytes for every
    replica."""
    if buf.ndim < 2 or buf.shape[1] < 2 or buf.strides[1] == 0:  # one array broadcast
        return True
    first = np.ascontiguousarray(buf[:, 0]).tobytes()
    return all(np.ascontiguousarray(buf[:, r]).tobytes() == first for r in range(1, buf.shape[1]))
