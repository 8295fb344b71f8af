"""Several folded ops' outputs that one all-reduce group reads, computed in one call at the
group (`ReplicaFold.together`; fold.py, fold_reduce.py).

GPT's 9 layer norms each make their parameter gradients (every replica's, side by side) in
a kernel call of their own after ``dx``'s, with three small calls around it to lay out its
operands: ~36 us more per layer norm than one replica's single call, measured in the R=4
step, nearly all of it per-call overhead on 32 x 32 operands. Their gradients are read only
by the group all-reduce after the backward graph, so each layer norm's site computes ``dx``
alone (`ReplicaFold.rest`) and leaves its operands here; the group computes all of their
parameter gradients in one call (the same arithmetic, the K calls' columns side by side)
and reduces them with the others.

Checked like every fold: each site's ``dx`` against the replicas' own calls at its first
call (which also hands this module the replicas' parameter gradients), and the group's
first call compares the together call's values with those, bit for bit; where any differs,
every later run computes each op's values with the replicas' own calls (`FoldSite.each`)
instead. A site whose ``dx`` did not match makes all of its outputs itself (the group then
reads them as they come).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

from ..graph import Op
from ..ops.call import CALL
from .bits import same_bits
from .fold_reduce import reduce_runs

__all__ = ["Together", "plan_together"]


class Together:
    """The ops of one group whose outputs are computed together, and, per run, their
    operands."""

    def __init__(self, ops: List[Op], outputs: List[int], replicas: int) -> None:
        self.ops, self.outputs, self.replicas = ops, outputs, replicas
        self.index = {op: k for k, op in enumerate(ops)}
        rule = ops[0].opdef.replica_fold
        self.kernel, self.attrs = rule.together, dict(ops[0].attrs)
        # group position -> (op index, output position in ``outputs``), set by `plan_together`
        self.members: Dict[int, tuple] = {}
        self.shapes: Dict[int, tuple] = {}  # group position -> its value's (folded) shape
        self.args: List[Optional[tuple]] = [None] * len(ops)  # this run's operands
        self.want: List[Optional[tuple]] = [None] * len(ops)  # the replicas' values (check)
        self.sites: Dict[Op, object] = {}  # op -> its `FoldSite` (the fallback's calls)

    def put(self, op: Op, args: tuple) -> None:
        """A site's operands for this run (its ``rest`` computed the other outputs)."""
        self.args[self.index[op]] = args

    def wanted(self, op: Op, want: tuple) -> None:
        """The replicas' own values of ``op``'s outputs (its site's first call)."""
        self.want[self.index[op]] = tuple(want[j] for j in self.outputs)

    def first(self, values: Sequence, state: dict) -> list:
        """The group's first call: ``values`` with the members their sites left None
        computed, each as its value's folded shape; ``state["together"]``: whether every
        site left them and the together call gave the replicas' bits (then later runs take
        `blocks`, else `fill`)."""
        values = list(values)
        missing = [p for p in self.members if values[p] is None]
        ok = len(missing) == len(self.members) and self._check()
        state["together"] = ok
        if missing:
            made = self._split(self._together()) if ok else self._each()
            for p in missing:
                k, m = self.members[p]
                values[p] = made[k][m].reshape(self.shapes[p])
        self._done()
        return values

    def blocks(self) -> list:
        """This run's values, every member's, per output one ``(R, K * n)`` block (the
        kept group's columns for them, `KeptGroup.layout`)."""
        made = self._together()
        self._done()
        return [t.view(self.replicas, -1) for t in made]

    def fill(self, values: Sequence) -> list:
        """``values`` with the members their sites left None made by the replicas' own
        calls (as ``(R, n)`` rows): where the together call did not match."""
        values = list(values)
        missing = [p for p in self.members if values[p] is None]
        if missing:
            made = self._each()
            for p in missing:
                k, m = self.members[p]
                values[p] = made[k][m]
        self._done()
        return values

    def layout(self) -> List[List[int]]:
        """Per output, the group positions of its K values in call order (`blocks`)."""
        where = {km: p for p, km in self.members.items()}
        return [[where[k, m] for k in range(len(self.ops))] for m in range(len(self.outputs))]

    def _done(self) -> None:
        self.args = [None] * len(self.ops)  # the operands are dead now

    def _together(self) -> list:
        return self.kernel(self.args, self.replicas, **self.attrs)

    def _split(self, made: list) -> list:
        """The together call's values per call: ``[k][m]`` as ``(R, n)`` rows."""
        r = self.replicas
        return [[t[:, k].reshape(r, -1) for t in made] for k in range(len(self.ops))]

    def _each(self) -> dict:
        """The values of the ops whose sites left operands, from the replicas' own calls,
        as ``(R, n)`` rows (``[k][m]``)."""
        out = {}
        for k, (op, args) in enumerate(zip(self.ops, self.args)):
            if args is None:  # its site made all of its outputs
                continue
            res = self.sites[op].each(args)
            res = res if isinstance(res, tuple) else (res,)
            out[k] = [res[j].reshape(self.replicas, -1) for j in self.outputs]
        return out

    def _check(self) -> bool:
        if any(a is None for a in self.args) or any(w is None for w in self.want):
            return False
        try:
            made = self._split(self._together())
        except (RuntimeError, ValueError, IndexError):
            return False
        for got, want in zip(made, self.want):
            for g, w in zip(got, want):
                if not same_bits(g.reshape(w.shape), w):
                    return False
        return True


def plan_together(plan, live: Sequence[Op]) -> None:
    """Fill ``plan.together`` (op -> its `Together`) and ``plan.together_groups`` (group
    key -> `Together`): in each run of all-reduces that makes one group call, the folded
    ops of one type, shapes and attributes, at least two, whose `ReplicaFold.together`
    outputs only that run's all-reduces read."""
    for run in reduce_runs(live, plan):
        if len(run) < 2:
            continue
        found: Dict[Op, Dict[int, int]] = {}  # op -> {output index: group position}
        for p, all_reduce in enumerate(run):
            source = _source(all_reduce.inputs[0], plan)
            if source is not None:
                found.setdefault(source[0], {})[source[1]] = p
        classes: Dict[tuple, List[Op]] = {}
        for op, outs in found.items():
            rule = op.opdef.replica_fold
            want = [j for j in rule.together_outputs if j < len(op.outputs)]
            if want and sorted(outs) == want and not _reduced(op, plan):
                classes.setdefault(_key(op), []).append(op)
        ops = max(classes.values(), key=len, default=[])
        if len(ops) < 2:
            continue
        outputs = sorted(found[ops[0]])
        together = Together(ops, outputs, plan.replicas)
        for k, op in enumerate(ops):
            for m, j in enumerate(outputs):
                p = found[op][j]
                together.members[p] = (k, m)
                shape = tuple(run[p].inputs[0].shape)
                together.shapes[p] = (
                    (plan.replicas * shape[0], *shape[1:]) if shape else (plan.replicas,)
                )
            plan.together[op] = together
        plan.together_groups[f"{run[0].type}.{run[0].id}"] = together


def _source(t, plan):
    """(op, output index) of the folded graph op whose output the call returns as ``t``,
    where nothing else reads it and the op offers `ReplicaFold.together`; else None."""
    call = t.producer
    if call is None or call.opdef is not CALL or call.called_graphs[0] not in plan.graphs:
        return None
    g = call.called_graphs[0]
    s = g._outputs[call.outputs.index(t)]
    op = s.producer
    if op is None or g._outputs.count(s) != 1 or g.consumers(s):
        return None
    rule = op.opdef.replica_fold
    if rule is None or rule.together is None:
        return None
    return op, op.outputs.index(s)


def _reduced(op: Op, plan) -> bool:
    return op in plan.reduced


def _key(op: Op) -> tuple:
    shapes = tuple(tuple(t.shape) for t in op.inputs)
    dtypes = tuple(t.dtype for t in op.inputs)
    return op.type, shapes, dtypes, tuple(sorted((k, repr(v)) for k, v in op.attrs.items()))
