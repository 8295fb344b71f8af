"""A folded run's all-reduces (`fold.py`): every replica's value is its rows of one tensor.

The unfolded run reduces each gradient by adding the replicas' values in replica order
(``v0 + v1``, then ``+ v2``, ...) and, for a mean, dividing the sum in place
(`collectives.reduce_values`). Here the same arithmetic runs in fewer calls, where the first
run finds it gives the same bits (else the op's own reduction runs, as before):

- one all-reduce: one ``torch.sum`` over the replica dim into a buffer kept between runs;
- a run of consecutive all-reduces of small gradients (GPT's 53 after its backward graph):
  their values side by side in one ``(R, n)`` tensor, one ``torch.sum`` over the replica dim
  (and one division), each result a view of it (53 calls of Python and dispatch a step
  otherwise; torch's multi-tensor adds loop over the tensors on a CPU);
- an all-reduce that alone reads an output of a folded op whose `ReplicaFold.reduced`
  computes it all-reduced (a weight gradient of at least `FUSE_BYTES`): the op's site
  returns the all-reduce's result and the all-reduce passes it on (`plan_fused`,
  `ReducedOutputs`): the R weight-sized values are never written out and read back.
"""

from __future__ import annotations

import enum
from collections import Counter
from typing import Callable, Dict, List, Optional, Sequence

import torch

from ..graph import Op
from ..ops.call import CALL
from ..ops.collectives.collectives import reduce_values, summed
from .bits import as_tuple, first_match, same_bits, same_outputs
from .speed import fold_rule

__all__ = [
    "FUSE_BYTES",
    "GROUP_BYTES",
    "ReduceBy",
    "ReducedOutputs",
    "plan_fused",
    "reduce_group",
    "reduce_runs",
    "sole_graph_source",
    "check_summed",
]

# consecutive all-reduces whose values (all replicas') are at most this many bytes in all
# run as one group: beyond it the per-op sums into kept buffers avoid allocating (and
# faulting in) fresh results every run
GROUP_BYTES = 4 * 2**20
# a value (one replica's) of at least this many bytes is all-reduced by its folded op where
# that op offers it (`plan_fused`): measured on the AMD EPYC host, R=4, rank-8 weight
# gradients, one thread: the GEMM-and-add chain costs 28 us against the batched GEMM and sum's
# 28 us at 64 KiB, 40 against 54 at 128 KiB, 360 against 620 at 1.6 MB (below it a group's
# one sum costs less)
FUSE_BYTES = 128 * 2**10


def check_summed(rows: torch.Tensor, op, want: torch.Tensor) -> Optional[torch.Tensor]:
    """A buffer for `summed`, where it gives the all-reduce's bits on these values (``op``:
    a reduction its rule's `ReplicaReduce.summed` names)."""
    if not rows.is_floating_point() or rows.shape[0] > 4:
        return None
    out = torch.empty_like(want)
    return out if same_bits(summed(rows, op, out), want) else None


class ReduceBy(enum.Enum):
    """How a folded main graph's full all-reduce is computed: its one case, decided at
    Session build (`fold.plan_reduces`) from its input's source op and that op's rule
    (`ReplicaFold.reduced`, `ReplicaFold.together`). An all-reduce without one is
    `FoldRuntime.collective`'s (its own reduction, or one sum into a kept buffer where
    `check_summed` found it the same bits)."""

    SITE = "site"  # the folded op making its input returns it all-reduced: passed on
    GROUP = "group"  # one of a run made in one call at the run's first (`all_reduce_group`)


def reduce_runs(live: Sequence[Op], plan) -> List[List[Op]]:
    """The runs of consecutive all-reduces that may make one call each (a run of one: an
    all-reduce that could join one), in schedule order."""
    runs: List[List[Op]] = []
    run: List[Op] = []
    for op in (*live, None):
        if op is not None and _groupable(op, plan, run):
            run.append(op)
            continue
        if run:
            runs.append(run)
        run = [op] if op is not None and _groupable(op, plan, []) else []
    return runs


def _groupable(op: Op, plan, run: List[Op]) -> bool:
    if not _summed(plan, op) or plan.reduce_by.get(op) is ReduceBy.SITE:
        return False
    t, kind = op.inputs[0], op.attrs["op"]
    if t.dtype.as_torch().is_complex:
        return False
    if not t.dtype.as_torch().is_floating_point or (run and run[0].attrs["op"] != kind):
        return False
    size = sum(x.inputs[0].spec.nbytes for x in run) + t.spec.nbytes
    return size * plan.replicas <= GROUP_BYTES


def _summed(plan, op: Op) -> bool:
    """``op`` is a full all-reduce of the fold (`fold.FoldCollective`) of a per-replica
    value with rows that one sum over the replica dim may make (its rule's
    `ReplicaReduce.summed`)."""
    c = plan.collectives.get(f"{op.type}.{op.id}")
    return c is not None and c.summed and c.per_replica and c.rank > 0


def reduce_group(values: Sequence[torch.Tensor], op: str, replicas: int, state):
    """Every value's all-reduce (each ``(R*rows, ...)``): one sum over the values side by
    side where the first call found it equal to the per-value reduction (``state.flat``,
    `fold.GroupState`), else that."""
    ok = state.flat
    if ok:
        return _flat(values, op, replicas)
    parts = [v.view(replicas, -1, *v.shape[1:]).unbind() for v in values]
    want = [reduce_values(op, list(p)) for p in parts]
    if ok is None:
        state.flat = replicas <= 4 and same_outputs(_flat(values, op, replicas), want)
    return want


def _flat(values: Sequence[torch.Tensor], op: str, replicas: int) -> List[torch.Tensor]:
    rows = torch.cat([v.reshape(replicas, -1) for v in values], 1)
    total = summed(rows, op, None)
    sizes = [v.numel() // replicas for v in values]
    shapes = [(v.shape[0] // replicas, *v.shape[1:]) for v in values]
    return [t.view(s) for t, s in zip(total.split(sizes), shapes)]


def plan_fused(plan, live: Sequence[Op]) -> None:
    """Fill ``plan.reduced`` (folded op -> {output index: reduction}) and mark the all-reduces they
    compute `ReduceBy.SITE`. A full ``add``/``mean`` all-reduce of the main graph can be fused where
    its per-replica floating point input is a call's output that nothing else reads, made by an op
    of the called graph that nothing else there reads it from, and the op's `ReplicaFold.reduced`
    offers that output; an op with such an output of `FUSE_BYTES` or more (one replica's) reduces
    all of its own (a weight gradient and its bias's), and so does an op whose all-reduces would
    make a `reduce_runs` run (or a lone all-reduce) of their own: its reduced kernel then replaces
    that run's call."""
    readers = Counter(t for op in live for t in op.inputs)
    found: Dict[Op, list] = {}
    for op in live:
        if not _summed(plan, op):
            continue
        t, kind = op.inputs[0], op.attrs["op"]
        dtype = t.dtype.as_torch()
        if readers[t] != 1 or not dtype.is_floating_point or dtype.is_complex:
            continue
        source = _graph_source(t, plan)
        if source is not None:
            found.setdefault(source[0], []).append((source[1], kind, op))
    for site, outputs in found.items():
        if any(all_reduce.inputs[0].spec.nbytes >= FUSE_BYTES for *_, all_reduce in outputs):
            _fuse(plan, site, outputs)
    owner = {all_reduce: site for site, outs in found.items() for *_, all_reduce in outs}
    for run in reduce_runs(live, plan):
        sites = {owner.get(op) for op in run}
        shared = sites.pop() if len(sites) == 1 else None
        if shared is not None and len(run) == len(found[shared]):
            _fuse(plan, shared, found[shared])


def _fuse(plan, site: Op, outputs: list) -> None:
    plan.reduced[site] = {j: kind for j, kind, _ in outputs}
    plan.reduce_by.update((all_reduce, ReduceBy.SITE) for *_, all_reduce in outputs)


def sole_graph_source(t, plan):
    """(op, output index) of the folded graph's op whose output the call returns as ``t``,
    where nothing else reads it (not the graph, not another of its outputs); else None."""
    call = t.producer
    if call is None or call.opdef is not CALL or call.called_graphs[0] not in plan.graphs:
        return None
    g = call.called_graphs[0]
    s = g._outputs[call.outputs.index(t)]
    op = s.producer
    if op is None or g._outputs.count(s) != 1 or g.consumers(s):
        return None
    return op, op.outputs.index(s)


def _graph_source(t, plan):
    """`sole_graph_source`, where that op can all-reduce the output; else None."""
    source = sole_graph_source(t, plan)
    if source is None:
        return None
    op, j = source
    rule = fold_rule(op.opdef)
    return source if rule is not None and rule.reduced and j in rule.reduces else None


class ReducedOutputs:
    """A fold site's outputs that only a full all-reduce reads (`plan_fused`): the site
    returns that all-reduce's result. The first call compares the op's reduced kernels with
    the replicas' own values reduced as the all-reduce reduces them, bit for bit; where none
    matches, the site's chosen call is followed by that reduction (one sum over the replica
    dim into a kept buffer where it matched, as `check_summed`)."""

    def __init__(self, kinds: Dict[int, str], replicas: int, calls: List[Callable], keep: bool):
        self.kinds, self.replicas, self.calls, self.keep = kinds, replicas, calls, keep
        # the unreduced call the last check fell back to (None: a reduced kernel matched)
        self.fallback: Optional[Callable] = None

    def check(self, args: tuple, want: tuple, base: Callable):
        """``(result, chosen call)`` given the replicas' values ``want`` and the site's
        chosen unreduced call ``base``."""
        ref = self._reduce(want, {})
        self.fallback = None
        found = first_match(self.calls, args, ref)
        if found is not None:
            call, got = found
            return got, call
        self.fallback = base
        outs = {j: self._buffer(want[j], kind, ref[j]) for j, kind in self.kinds.items()}
        return _result(ref), lambda *a: _result(self._reduce(as_tuple(base(*a)), outs))

    def _rows(self, value: torch.Tensor) -> torch.Tensor:
        return value.view(self.replicas, -1, *value.shape[1:])

    def _buffer(self, value, kind, want) -> Optional[torch.Tensor]:
        return check_summed(self._rows(value), kind, want) if self.keep else None

    def _reduce(self, outs: tuple, buffers: Dict[int, Optional[torch.Tensor]]) -> tuple:
        res = list(outs)
        for j, kind in self.kinds.items():
            rows, out = self._rows(outs[j]), buffers.get(j)
            res[j] = summed(rows, kind, out) if out is not None else _reduce(rows, kind)
        return tuple(res)


def _reduce(rows: torch.Tensor, kind: str) -> torch.Tensor:
    """The all-reduce's own reduction of the replicas' values (`reduce_values`)."""
    return reduce_values(kind, list(rows.unbind()))


def _result(res: tuple):
    return res[0] if len(res) == 1 else res
