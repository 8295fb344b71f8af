"""Replica folding: R data-parallel replicas' main graph run once over their values.

With R replicas in lock step every replica runs the same graphs over its 1/R of the batch,
R times the per-op work of the one-replica step (GPT's ~170 small ops a step, each on 1/R
of the data). Where the run shares its replica-uniform work (`uniform.py`), the replicas'
step can instead run once: a *per-replica* value of shape ``(b, ...)`` is one tensor
``(R*b, ...)``, the replicas' rows in replica order (a rank-0 value: ``(R,)``), and a
*uniform* value (a shared variable, a constant, an all-reduced result, a checked small
stream) is one tensor of its own shape. Then

- a host load of a per-replica stream is the run's ``[R, ...]`` transfer, a store writes
  every replica's rows (a uniform value to each replica);
- an all-reduce over every replica is its own reduction over the replicas' rows (the same
  function over the same values in replica order: the same bits), one uniform result; where
  it alone reads a large weight gradient, the gradient's op computes it (`fold_reduce.py`);
  a run of small ones is one group call in kept buffers (`fold_group.py`), which also makes
  the values only it reads (`fold_together.py`: layer norms' and linear layers' parameter
  gradients);
- each op of a called graph with a per-replica input runs as a `batched_site.BatchedSite`
  whose rows are made for the step (`RowsAt.STEP`): one kernel call over the concatenated
  rows where its `speed.ReplicaBatching.fold` says the op is row-wise there (checked bit
  for bit against the replicas' own calls once per shape), else the replicas' own calls one
  by one, their outputs concatenated;
- ops whose inputs are all uniform (the optimizer update) run once, as in `uniform.py`.

Preconditions, checked at Session build (`plan_fold`; else the replicas run as before): one
process runs every replica in lock step, the run shares (`uniform.Sharing`), every variable
the main graph reads is a shared one (no RTS shards, no replica groupings), and the main
graph's other ops are host loads and stores, collectives over all replicas whose rule has a
`forms.ReplicaReduce` (the non-in-place all-reduce), pure ops of uniform inputs, and plain
calls (one site each) of graphs whose ops are plain kernels (no collectives, streams, remote
buffers, in-place writes or nested calls; a random op has no `ReplicaFold`: with a seed per
replica, each replica's own call draws its numbers). Each run folds only where
`SharedRuns.prepare` shares it (a host write unshares; `batching.ReplicaRuns` decides).
``CompileOptions(fold_replicas=False)`` switches it off; tests compare both, bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, FrozenSet, List, Optional, Set

import numpy as np
import torch

from ..graph import Graph, Op
from ..host_data import host_to_torch, torch_to_host
from ..ops.call import CALL
from ..ops.collectives.collectives import summed
from ..ops.io import HOST_LOAD, HOST_STORE
from ..schedule import schedule
from ..tensor import Tensor, Variable
from .fold_group import KeptGroup
from .fold_reduce import ReduceBy, check_summed, plan_fused, reduce_group, reduce_runs
from .fold_together import Together, TogetherMode, plan_together
from .runtime import collective_results, next_transfer
from .speed import reduce_rule
from .uniform import full_all_reduce

if TYPE_CHECKING:  # pragma: no cover
    from .batched_site import BatchedSite

__all__ = ["FoldCollective", "FoldPlan", "FoldRuntime", "GroupState", "plan_fold", "plan_reduces"]


@dataclass(frozen=True)
class FoldCollective:
    """A full all-reduce of the folded main graph."""

    per_replica: bool  # its input is per replica (rows of all replicas), else uniform
    rank: int  # the input's rank on one replica
    op: Optional[str]  # its reduction ("add", "mean", ...)
    summed: bool  # one sum over the replica dim may make it (its rule's `ReplicaReduce`)


@dataclass
class GroupState:
    """What a group of all-reduces (`FoldRuntime.all_reduce_group`) found at its first call,
    by which later runs reduce."""

    flat: Optional[bool] = None  # one sum over the values side by side gave their bits
    kept: Optional[KeptGroup] = None  # its rows, total and result views, kept between runs
    # per `Together` of the group: how its values are made (`TogetherMode`)
    together: List[TogetherMode] = field(default_factory=list)


@dataclass
class FoldPlan:
    """Which tensors are per replica (rows of all replicas) in a folded run."""

    replicas: int
    uniform_streams: FrozenSet[object]
    stacked: Set[Tensor] = field(default_factory=set)
    graphs: Set[Graph] = field(default_factory=set)  # called graphs compiled folded
    collectives: Dict[str, FoldCollective] = field(default_factory=dict)  # by op name
    sites: List[BatchedSite] = field(default_factory=list)
    # main graph all-reduce -> its case (`plan_reduces`; none: `FoldRuntime.collective`)
    reduce_by: Dict[Op, ReduceBy] = field(default_factory=dict)
    runs: Dict[Op, List[Op]] = field(default_factory=dict)  # a group's first -> its run
    # folded op -> {output index: "add"/"mean"}: outputs its site returns all-reduced (the
    # all-reduces reading them are `ReduceBy.SITE`; `fold_reduce.plan_fused`)
    reduced: Dict[Op, Dict[int, str]] = field(default_factory=dict)
    # folded op -> the `fold_together.Together` computing some of its outputs at the group;
    # group key -> that `Together`
    together: Dict[Op, Together] = field(default_factory=dict)
    together_groups: Dict[str, List[Together]] = field(default_factory=dict)


def plan_fold(program) -> Optional[FoldPlan]:
    """The fold of ``program``'s main graph, or None where a precondition on its graphs
    fails (the program's own, its runtime and options, are `batching.ReplicaRuns`')."""
    ir, sharing = program.ir, program.sharing
    shared = {program.variables[i] for i in sharing.variables}
    plan = FoldPlan(ir.replication_factor, frozenset(sharing.streams))
    for op in program.main_plan.live:
        if any(isinstance(t, Variable) and t not in shared for t in op.inputs):
            return None
        if not _main_op(op, plan, ir):
            return None
    plan_reduces(plan, program.main_plan.live)
    return plan


def plan_reduces(plan: FoldPlan, live: List[Op]) -> None:
    """The one decision of how each full all-reduce of the folded main graph is computed
    (`fold_reduce.ReduceBy`), from the rules of the ops whose outputs they read: passed on
    from its input's folded op (`fold_reduce.plan_fused`), else in a run of consecutive
    ones made in one call (`fold_reduce.reduce_runs`), some of whose values the group makes
    itself (`fold_together.plan_together`), else alone."""
    plan_fused(plan, live)
    runs = [run for run in reduce_runs(live, plan) if len(run) > 1]
    for run in runs:
        plan.runs[run[0]] = run
        plan.reduce_by.update(dict.fromkeys(run, ReduceBy.GROUP))
    plan_together(plan, runs)


def _main_op(op: Op, plan: FoldPlan, ir) -> bool:
    """Plan one op of the main graph; False: the graph cannot be folded."""
    per = [t in plan.stacked for t in op.inputs]
    d = op.opdef
    if d is HOST_LOAD:
        if op.attrs["stream"] not in plan.uniform_streams:
            plan.stacked.update(op.outputs)
        return True
    if d is HOST_STORE:
        return True
    rule = reduce_rule(d)
    if rule is not None and full_all_reduce(op, ir):
        kind, rank = op.attrs.get("op"), len(op.inputs[0].shape)
        c = FoldCollective(per[0], rank, kind, kind in rule.summed)
        plan.collectives[f"{op.type}.{op.id}"] = c
        return True
    if d is CALL:
        mask = _plan_graph(op.called_graphs[0], per, plan)
        if mask is None:
            return False
        plan.stacked.update(t for t, m in zip(op.outputs, mask) if m)
        return True
    return not any(per) and not (op.called_graphs or d.collective or d.side_effect)


def _plan_graph(g: Graph, per: List[bool], plan: FoldPlan) -> Optional[List[bool]]:
    """Which outputs of called graph ``g`` are per replica, given its inputs'; None where
    ``g`` cannot be folded (called from two sites, or an op that is not a plain kernel)."""
    if g in plan.graphs or len(per) != len(g._inputs):
        return None
    plan.graphs.add(g)
    plan.stacked.update(t for t, m in zip(g._inputs, per) if m)
    for op in schedule(g):
        d = op.opdef
        if d.emit is not None or d.kernel is None or op.called_graphs or op.modified_inputs():
            return None
        if d.collective or d.side_effect or any(isinstance(t, Variable) for t in op.inputs):
            return None
        if any(t in plan.stacked for t in op.inputs):
            if any(0 in t.shape for t in (*op.inputs, *op.outputs)):
                return None
            plan.stacked.update(op.outputs)
    return [t in plan.stacked for t in g._outputs]


class FoldRuntime:
    """The `batching.ReplicaRuntime` a folded program's main graph calls: one run for all
    replicas."""

    def __init__(self, plan: FoldPlan) -> None:
        self.replicas = plan.replicas
        self.plan = plan
        self.local = range(1)  # kernels keep one set of buffers: the folded run is one run
        self.replica = 0
        self.slot = 0
        self.counts: Dict[object, int] = {}
        self.inputs: Dict[object, np.ndarray] = {}
        self.outputs: Dict[object, np.ndarray] = {}
        self.threads = torch.get_num_threads()
        self.runs = 0  # folded runs made (tests check that runs fold)
        # all-reduce -> whether one sum over the replicas' rows gives its bits (None: the
        # op's own reduction), and the buffer it sums into
        self.summed: Dict[str, Optional[torch.Tensor]] = {}
        self.groups: Dict[str, GroupState] = {}  # `all_reduce_group`'s key -> its state

    def start(self, inputs, outputs) -> None:
        self.inputs, self.outputs, self.counts = inputs, outputs, {}
        self.runs += 1
        threads = torch.get_num_threads()
        if threads != self.threads:  # kernels may split work differently: check again
            self.threads = threads
            self.summed.clear()
            self.groups.clear()
            for site in self.plan.sites:
                site.reset()

    def load(self, stream) -> torch.Tensor:
        buf = self.inputs[stream]
        i = next_transfer(self.counts, stream, buf, "loaded")
        if stream in self.plan.uniform_streams:  # checked equal on every replica
            return host_to_torch(np.array(buf[i, 0]))
        rows = np.array(buf[i])  # [R, ...]: the replicas' rows in order
        return host_to_torch(rows.reshape((-1, *rows.shape[2:]) if rows.ndim > 1 else -1))

    def skip(self, stream) -> None:
        next_transfer(self.counts, stream, self.inputs[stream], "loaded")

    def store(self, stream, value: torch.Tensor) -> None:
        buf = self.outputs[stream]
        i = next_transfer(self.counts, stream, buf, "stored")
        host = torch_to_host(value.detach())
        if host.shape == buf.shape[2:]:  # a uniform value: every replica's
            buf[i, :] = host
        else:
            buf[i] = host.reshape(buf.shape[1:])

    def collective(self, value: torch.Tensor, fn, need: bool = True) -> torch.Tensor:
        """An all-reduce over every replica (`plan_fold` admits no other): ``fn`` over the
        replicas' values in replica order, once."""
        r = self.replicas
        c = self.plan.collectives[fn.op_name]
        per, rank, op = c.per_replica, c.rank, c.op
        if not per:  # every replica's value is this one
            return _first_result(fn, [value] * r)
        rows = value.view(r, -1, *value.shape[1:]) if rank else value
        out = self.summed.get(fn.op_name, rows)
        if out is None:
            return _first_result(fn, list(rows.unbind()))
        if out is not rows:
            assert op is not None  # `check_summed` kept a buffer: ``c.summed`` holds
            return summed(rows, op, out)
        want = _first_result(fn, list(rows.unbind()))
        self.summed[fn.op_name] = check_summed(rows, op, want) if c.summed else None
        return want

    def all_reduce_group(self, values, op: str, key: str, keep: bool) -> List[torch.Tensor]:
        """Consecutive all-reduces of the main graph as one call (`fold_reduce.py`); ``keep``:
        the graph runs once a run, its buffers and result views are kept (`fold_group.py`)
        once the first call found the one sum equal to the per-value reductions."""
        state = self.groups.setdefault(key, GroupState())
        togethers = self.plan.together_groups.get(key, ())  # values made here
        if state.kept is not None:
            values, blocks = _made_here(togethers, values, state.together, state.kept)
            return state.kept.reduce(values, op, blocks)
        oks = []
        for together in togethers:
            values, ok = together.first(values)
            oks.append(ok)
        state.together = [TogetherMode.first(t, ok) for t, ok in zip(togethers, oks)]
        results = reduce_group(values, op, self.replicas, state)
        if keep and state.flat:
            made = [t for t, ok in zip(togethers, oks) if ok]  # else: their values as they come
            blocks = [col for t in made if not t.into for col in t.layout()]
            into = [p for t in made if t.into for p in t.members]
            kept = KeptGroup(values, self.replicas, blocks, into)
            if kept.check(values, op, results):  # else: `reduce_group` every run
                state.kept = kept
        return results


def _made_here(togethers, values, modes: List[TogetherMode], kept) -> tuple:
    """A kept group's run: ``(values, blocks)`` for `KeptGroup.reduce`, each `Together`'s
    values made as its mode says (``modes`` updated where a first write's check failed)."""
    blocks: list = []
    for i, (together, mode) in enumerate(zip(togethers, modes)):
        if mode is TogetherMode.FILL:
            values = together.fill(values)
        elif mode is TogetherMode.BLOCKS:
            blocks += together.blocks()
        elif mode is TogetherMode.EACH:
            together.write_each(kept.dest)
        else:
            ok = together.write(kept.dest, check=mode is TogetherMode.INTO)
            modes[i] = TogetherMode.CHECKED if ok else TogetherMode.EACH
    return values, blocks


def _first_result(fn, values: List[torch.Tensor]) -> torch.Tensor:
    """Replica 0's result of the all-reduce ``fn`` over ``values`` (every replica's result is
    the same: the others are not made)."""
    return collective_results(fn, values, [True] + [False] * (len(values) - 1))[0]
