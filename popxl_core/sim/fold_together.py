"""Folded ops' outputs that one all-reduce group alone reads, computed at the group
(`ReplicaFold.together`; fold.py, fold_reduce.py, fold_group.py).

GPT's 9 layer norms each made their parameter gradients (every replica's, side by side) in
a kernel call of their own after ``dx``'s, with three small calls around it to lay out its
operands: ~36 us more per layer norm than one replica's single call, measured in the R=4
step, nearly all of it per-call overhead on 32 x 32 operands. Their gradients are read only
by the group all-reduce after the backward graph, so each layer norm's site computes ``dx``
alone (`ReplicaFold.rest`) and leaves its operands here; the group computes all of their
parameter gradients in one call (the same arithmetic, the K calls' columns side by side),
which the kept group takes as blocks of its columns. Its 17 linear layers' weight and bias
gradients (33 values, `ReplicaFold.together_into`) are written by their batched GEMM and sum
straight into the group's kept rows, not into buffers of their own that the group then
copies.

Checked like every fold: each site's ``dx`` against the replicas' own calls at its first
call (which also hands this module the replicas' other values), and the group's first call
compares the together call's values with those, bit for bit (a ``together_into`` kernel's:
at its first write into the kept rows); where any differs, or a site fell back, every later
run computes those ops' values with the replicas' own calls (`BatchedSite.each`) instead. A
site whose ``dx`` did not match makes all of its outputs itself (the group then reads them
as they come).
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence

import torch

from ..graph import Op
from .bits import same_bits, same_outputs
from .fold_reduce import sole_graph_source

if TYPE_CHECKING:  # pragma: no cover
    from .batched_site import BatchedSite
from .speed import fold_rule, known_fold

__all__ = ["Together", "TogetherMode", "plan_together"]


class TogetherMode(enum.Enum):
    """How a kept group (`fold_group.KeptGroup`) gets a `Together`'s values each run."""

    FILL = "fill"  # its sites' values as they come (the together call did not match)
    BLOCKS = "blocks"  # the together call's values, as blocks of the group's columns
    INTO = "into"  # its kernel writes into the group's rows: checked at the first write
    CHECKED = "checked"  # ... and that write matched
    EACH = "each"  # ... it did not: the replicas' own calls, copied into the rows

    @classmethod
    def first(cls, together: "Together", ok: bool) -> "TogetherMode":
        """The mode after the group's first call (``ok``: `Together.first`'s check)."""
        if not ok:
            return cls.FILL
        return cls.INTO if together.into else cls.BLOCKS


class Together:
    """The ops of one group whose outputs are computed together, and, per run, their
    operands."""

    def __init__(self, ops: List[Op], outputs: List[int], replicas: int) -> None:
        self.ops, self.outputs, self.replicas = ops, outputs, replicas
        self.index = {op: k for k, op in enumerate(ops)}
        rule = known_fold(ops[0].opdef)
        assert rule.together is not None  # `plan_together` groups only ops offering it
        self.kernel, self.attrs, self.into = rule.together, dict(ops[0].attrs), rule.together_into
        # group position -> (op index, output position in ``outputs``), set by `plan_together`
        self.members: Dict[int, tuple] = {}
        self.shapes: Dict[int, tuple] = {}  # group position -> its value's (folded) shape
        self.dtypes: Dict[int, torch.dtype] = {}
        self.args: List[Optional[tuple]] = [None] * len(ops)  # this run's operands
        self.want: List[Optional[tuple]] = [None] * len(ops)  # the replicas' values (check)
        self.sites: Dict[Op, BatchedSite] = {}  # op -> its site (the fallback's calls)
        self._at: Optional[List[List[int]]] = None  # `_where`, made once
        self._outs: Optional[tuple] = None  # `write`'s (dest, its views by call and output)

    def put(self, op: Op, args: tuple) -> None:
        """A site's operands for this run (its ``rest`` computed the other outputs)."""
        self.args[self.index[op]] = args

    def wanted(self, op: Op, want: tuple) -> None:
        """The replicas' own values of ``op``'s outputs (its site's first call)."""
        self.want[self.index[op]] = tuple(want[j] for j in self.outputs)

    def first(self, values: Sequence) -> tuple:
        """The group's first call: ``(values, ok)``, the members their sites left None
        computed, each as its value's folded shape; ``ok``: every site left them and the
        together call gave the replicas' bits (then later runs take `blocks` or `write`,
        else `fill`)."""
        missing = self._missing(values)
        left = len(missing) == len(self.members) and None not in self.args
        # a together_into kernel is checked where it writes, at the first `write`
        ok = left and (self.into or self._check())
        if missing:
            made = self._split(self._made()) if ok and not self.into else self._each()
            values = self._put(values, missing, made)
        self._done()
        return values, ok

    def blocks(self) -> list:
        """This run's values, every member's, per output one ``(R, K * n)`` block (the
        kept group's columns for them, `layout`)."""
        made = self._made()
        self._done()
        return [t.view(self.replicas, -1) for t in made]

    def write(self, dest: Dict[int, torch.Tensor], check: bool) -> bool:
        """This run's values written into ``dest`` (group position -> ``(R, ...)`` view of
        the kept rows) by the ``together_into`` kernel; ``check``: compared with the
        replicas' own calls, bit for bit (a GEMM may take another path for an output with
        the rows' strides), and those written instead where any differs (False)."""
        want = self._each() if check else None
        where = self._where()
        outs = self._outs
        if outs is None or outs[0] is not dest:  # the destinations, made once per kept group
            outs = self._outs = (dest, [[dest[p] for p in row] for row in where])
        self.kernel(self.args, self.replicas, outs[1], **self.attrs)
        ok = want is None or all(
            same_bits(dest[p].reshape(self.replicas, -1), want[k][m])
            for k, row in enumerate(where)
            for m, p in enumerate(row)
        )
        if not ok and want is not None:  # (not ok: want was made)
            self._copy(dest, want)
        self._done()
        return ok

    def write_each(self, dest: Dict[int, torch.Tensor]) -> None:
        """The replicas' own calls' values copied into ``dest`` (where `write` found the
        together kernel's bits differ)."""
        self._copy(dest, self._each())
        self._done()

    def _copy(self, dest: Dict[int, torch.Tensor], made: dict) -> None:
        for k, row in enumerate(self._where()):
            for m, p in enumerate(row):
                dest[p].copy_(made[k][m].view(dest[p].shape))

    def fill(self, values: Sequence) -> Sequence:
        """``values`` with the members their sites left None made by the replicas' own
        calls: where the together call did not match."""
        missing = self._missing(values)
        if missing:
            values = self._put(values, missing, self._each())
        self._done()
        return values

    def _missing(self, values: Sequence) -> List[int]:
        """The members' group positions whose sites left their values to this group."""
        return [p for p in self.members if values[p] is None]

    def _put(self, values: Sequence, missing: List[int], made) -> list:
        """``values`` with each of ``missing`` taken from ``made`` (``[k][m]``, ``(R, n)``
        rows) as its value's folded shape."""
        values = list(values)
        for p in missing:
            k, m = self.members[p]
            values[p] = made[k][m].reshape(self.shapes[p])
        return values

    def layout(self) -> List[List[int]]:
        """Per output, the group positions of its K values in call order (`blocks`)."""
        return [list(col) for col in zip(*self._where())]

    def _where(self) -> List[List[int]]:
        """``[k][m]``: the group position of call k's output m."""
        if self._at is None:  # (`plan_together` fills ``members`` before any run)
            where = {km: p for p, km in self.members.items()}
            ops, outs = range(len(self.ops)), range(len(self.outputs))
            self._at = [[where[k, m] for m in outs] for k in ops]
        return self._at

    def _done(self) -> None:
        self.args = [None] * len(self.ops)  # the operands are dead now

    def _made(self) -> list:
        """The together call's values: per output ``(R, K, ...)``; a ``together_into``
        kernel's ``[k][m]`` (``(R, ...)``) in fresh tensors."""
        if not self.into:
            return self.kernel(self.args, self.replicas, **self.attrs)
        r = self.replicas
        outs = [
            [torch.empty(_rows_shape(self.shapes[p], r), dtype=self.dtypes[p]) for p in row]
            for row in self._where()
        ]
        self.kernel(self.args, self.replicas, outs, **self.attrs)
        return outs

    def _split(self, made: list) -> list:
        """The together call's values per call: ``[k][m]`` as ``(R, n)`` rows."""
        r = self.replicas
        if self.into:
            return [[t.reshape(r, -1) for t in row] for row in made]
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
            made = self._split(self._made())
        except (RuntimeError, ValueError, IndexError):
            return False
        for got, want in zip(made, self.want):
            assert want is not None  # checked above: every replica's values are in
            if not same_outputs([g.reshape(w.shape) for g, w in zip(got, want)], want):
                return False
        return True


def plan_together(plan, runs: Sequence[List[Op]]) -> None:
    """Fill ``plan.together`` (op -> its `Together`) and ``plan.together_groups`` (group
    key -> its `Together`s): in each of ``runs`` (all-reduces making one group call), the
    folded ops whose `ReplicaFold.together` outputs only that run's all-reduces read, by
    class: one type and attributes, and for a side-by-side kernel (not ``together_into``)
    one set of shapes and at least two ops."""
    for run in runs:
        found: Dict[Op, Dict[int, int]] = {}  # op -> {output index: group position}
        for p, all_reduce in enumerate(run):
            source = _source(all_reduce.inputs[0], plan)
            if source is not None:
                found.setdefault(source[0], {})[source[1]] = p
        classes: Dict[tuple, List[Op]] = {}
        for op, outs in found.items():
            rule = known_fold(op.opdef)
            want = [j for j in rule.together_outputs if j < len(op.outputs)]
            if want and sorted(outs) == want and op not in plan.reduced:
                classes.setdefault(_key(op), []).append(op)
        made = []
        for ops in classes.values():
            if len(ops) < 2 and not known_fold(ops[0].opdef).together_into:
                continue
            made.append(_together(ops, sorted(found[ops[0]]), found, run, plan))
        if made:
            plan.together_groups[f"{run[0].type}.{run[0].id}"] = made


def _together(ops: List[Op], outputs: List[int], found, run, plan) -> Together:
    together = Together(ops, outputs, plan.replicas)
    for k, op in enumerate(ops):
        for m, j in enumerate(outputs):
            p = found[op][j]
            together.members[p] = (k, m)
            shape = tuple(run[p].inputs[0].shape)
            together.shapes[p] = (
                (plan.replicas * shape[0], *shape[1:]) if shape else (plan.replicas,)
            )
            together.dtypes[p] = run[p].inputs[0].dtype.as_torch()
        plan.together[op] = together
    return together


def _rows_shape(folded: tuple, replicas: int) -> tuple:
    """``(R, ...)``: a value of folded shape ``(R * b, ...)`` by replica (`KeptGroup.dest`)."""
    return (replicas, folded[0] // replicas, *folded[1:])


def _source(t, plan):
    """`sole_graph_source`, where that op offers `ReplicaFold.together`; else None."""
    source = sole_graph_source(t, plan)
    if source is None:
        return None
    rule = fold_rule(source[0].opdef)
    return source if rule is not None and rule.together is not None else None


def _key(op: Op) -> tuple:
    attrs = tuple(sorted((k, repr(v)) for k, v in op.attrs.items()))
    dtypes = tuple(t.dtype for t in op.inputs)
    if known_fold(op.opdef).together_into:  # one call per op: any shapes
        return op.type, dtypes, attrs
    return op.type, tuple(tuple(t.shape) for t in op.inputs), dtypes, attrs
