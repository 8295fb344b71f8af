"""A folded run's all-reduces (`fold.py`): every replica's value is its rows of one tensor.

The unfolded run reduces each gradient by adding the replicas' values in replica order
(``v0 + v1``, then ``+ v2``, ...) and, for a mean, dividing the sum in place
(`collectives.reduce_values`). Here the same arithmetic runs in fewer calls, where the first
run finds it gives the same bits (else the op's own reduction runs, as before):

- one all-reduce: one ``torch.sum`` over the replica dim into a buffer kept between runs;
- a run of consecutive all-reduces of small gradients (GPT's 53 after its backward graph):
  their values side by side in one ``(R, n)`` tensor, one ``torch.sum`` over the replica dim
  (and one division), each result a view of it (53 calls of Python and dispatch a step
  otherwise; torch's multi-tensor adds loop over the tensors on a CPU).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import torch

from ..graph import Op
from ..ops.collectives.collectives import reduce_values
from ..ops.collectives.replicated import ALL_REDUCE
from .bits import same_bits

__all__ = ["GROUP_BYTES", "ReduceGroups", "reduce_group", "summed", "check_summed"]

# consecutive all-reduces whose values (all replicas') are at most this many bytes in all
# run as one group: beyond it the per-op sums into kept buffers avoid allocating (and
# faulting in) fresh results every run
GROUP_BYTES = 4 * 2**20


def summed(rows: torch.Tensor, op: str, out: torch.Tensor) -> torch.Tensor:
    """The replicas' values summed in one pass over dim 0 (the mean divided after, as the
    all-reduce's own reduction does)."""
    total = torch.sum(rows, 0, out=out)
    return total.div_(rows.shape[0]) if op == "mean" else total


def check_summed(rows: torch.Tensor, op, want: torch.Tensor) -> Optional[torch.Tensor]:
    """A buffer for `summed`, where it gives the all-reduce's bits on these values."""
    if op not in ("add", "mean") or not rows.is_floating_point() or rows.shape[0] > 4:
        return None
    out = torch.empty_like(want)
    return out if same_bits(summed(rows, op, out), want) else None


class ReduceGroups:
    """Runs of consecutive foldable all-reduces of a folded main graph's schedule."""

    def __init__(self, live: Sequence[Op], plan) -> None:
        self.first: Dict[Op, List[Op]] = {}
        self.member: set = set()
        run: List[Op] = []
        for op in (*live, None):
            if op is not None and self._groupable(op, plan, run):
                run.append(op)
                continue
            if len(run) > 1:
                self.first[run[0]] = run
                self.member.update(run[1:])
            run = [op] if op is not None and self._groupable(op, plan, []) else []

    @staticmethod
    def _groupable(op: Op, plan, run: List[Op]) -> bool:
        if op.opdef is not ALL_REDUCE:
            return False
        per, rank, kind = plan.collectives.get(f"{op.type}.{op.id}", (False, 0, None))
        t = op.inputs[0]
        if not per or not rank or kind not in ("add", "mean") or t.dtype.as_torch().is_complex:
            return False
        if not t.dtype.as_torch().is_floating_point or (run and run[0].attrs["op"] != kind):
            return False
        size = sum(x.inputs[0].spec.nbytes for x in run) + t.spec.nbytes
        return size * plan.replicas <= GROUP_BYTES


def reduce_group(values: Sequence[torch.Tensor], op: str, replicas: int, state: dict):
    """Every value's all-reduce (each ``(R*rows, ...)``): one sum over the values side by
    side where the first call found it equal to the per-value reduction, else that."""
    ok = state.get("flat")
    if ok:
        return _flat(values, op, replicas)
    parts = [v.view(replicas, -1, *v.shape[1:]).unbind() for v in values]
    want = [reduce_values(op, list(p)) for p in parts]
    if ok is None:
        state["flat"] = replicas <= 4 and all(
            same_bits(a, b) for a, b in zip(_flat(values, op, replicas), want)
        )
    return want


def _flat(values: Sequence[torch.Tensor], op: str, replicas: int) -> List[torch.Tensor]:
    rows = torch.cat([v.reshape(replicas, -1) for v in values], 1)
    total = summed(rows, op, None)
    sizes = [v.numel() // replicas for v in values]
    shapes = [(v.shape[0] // replicas, *v.shape[1:]) for v in values]
    return [t.view(s) for t, s in zip(total.split(sizes), shapes)]
