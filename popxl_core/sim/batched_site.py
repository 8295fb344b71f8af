"""One op's R replica calls as one call: the site both kinds of replica batching emit
(batching.py).

A `BatchedSite` holds what its op's rule (`speed.REPLICA_BATCHING`) allows: the ``fold``
forms over the replicas' *rows* (their values concatenated along dim 0, a rank-0 value one
element a replica; `forms.ReplicaFold`), each replica's own call of the op (the fallback,
the unbatched program's call), and the one bit check choosing between them (`bits.Checked`:
a GEMM's or a reduction's rows need not come out the same bits at R*b rows as at b, as MKL
picks kernels per shape and CPU). What differs is when the rows are made, the site's
`RowsAt`:

- `RowsAt.STEP`: a folded program (fold.py) holds every per-replica value as rows for the
  whole step. The generated code calls the site once with rows; its first call checks the
  forms against the fallback and binds the chosen call in the site's place (a compiled
  graph meets the same shapes and strides every run; `reset` checks again where the thread
  count changes). Host buffers' alignment past 16 bytes varies from run to run and is not
  checked: a GEMM packs its operands.
- `RowsAt.CALL`: each replica of a lock-step run calls the site with its own values and
  waits at the hub (`lockstep.py`), which makes the rows per call where every replica waits
  there with the shared inputs in one memory (`stacking.stacked_values`), checked per
  shapes, strides, alignment and threads.
"""

from __future__ import annotations

import enum
import functools
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from ..graph import Op
from .bits import Checked, as_tuple
from .speed import DEAD_OUTPUT_KERNELS, fold_rule
from .variants import SiteFacts

__all__ = [
    "BatchedSite",
    "RowsAt",
    "base_kernel",
    "folded_attrs",
    "folded_calls",
    "rows_fold",
    "rule_forms",
]


class RowsAt(enum.Enum):
    """When a batched site's rows (the replicas' values concatenated) are made."""

    STEP = "step"  # once for the whole step: a folded program holds them (fold.py)
    CALL = "call"  # per call, at the lock-step hub, from each replica's values (stacking.py)


class BatchedSite:
    """``op`` over all replicas' rows where checked equal, else each replica's own call.

    Args:
        rows_at: when the rows are made (`RowsAt`).
        facts: the op's `variants.site_facts`.
        own: one replica's own call of the op (the fallback).
        per: per input, whether it has rows (else one value for every replica).
        forms: the calls over the rows to try in order (`folded_calls`).
        skip: the outputs the check leaves out (not read, or made elsewhere).
    """

    def __init__(
        self,
        op: Op,
        rows_at: RowsAt,
        facts: SiteFacts,
        own: Callable,
        per: Sequence[bool],
        forms: Sequence[Callable],
        replicas: int,
        skip: frozenset = frozenset(),
    ) -> None:
        self.op, self.rows_at, self.facts, self.own = op, rows_at, facts, own
        self.per, self.replicas, self.skip = tuple(per), replicas, skip
        # per input: its rows on one replica (None: a rank-0 value, one element a replica)
        self.rows = tuple(t.shape[0] if len(t.shape) else None for t in op.inputs)
        self.shapes = tuple(tuple(t.shape) for t in op.outputs)  # one replica's
        self.checked = Checked(forms, outputs=self._compared)
        self.chosen: Optional[Callable] = None  # STEP: the call bound in the site's place
        self.name = ""  # STEP: its global in the generated code
        self.namespace: Dict[str, Any] = {}
        self.runtime: Any = None  # CALL: the runtime whose hub the replicas wait at
        self.together: Any = None  # STEP: `fold_together.Together` making some outputs
        self.reduced: Any = None  # STEP: `fold_reduce.ReducedOutputs` of its outputs

    def __call__(self, *args):
        if self.rows_at is RowsAt.STEP:
            return self._first_call(args)
        hub = self.runtime.stack_hub()  # `stacking.stacked_values` answers there
        value = None if hub is None else hub.switch(StackRequest(self, args))
        if value is None:
            return self.own(*args)
        return value[0] if len(value) == 1 else tuple(value)

    def check(self, key: Any, rows: tuple, want: tuple) -> Optional[Tuple[Callable, Any]]:
        """The first form whose outputs on ``rows`` are ``want``'s bits (the fallback's,
        as rows), remembered for ``key`` (`bits.Checked`)."""
        return self.checked.check(key, rows, self._compared(want))

    def _compared(self, result) -> tuple:
        """A result's outputs as the check compares them: None for the skipped ones."""
        outs = as_tuple(result)
        return tuple(None if j in self.skip else t for j, t in enumerate(outs))

    # rows and replicas
    def each(self, args: tuple):
        """Every replica's own call on its part of ``args`` (rows), outputs as rows."""
        columns = [
            self.parts(a, i) if p else (a,) * self.replicas
            for i, (a, p) in enumerate(zip(args, self.per))
        ]
        outs = self.join([as_tuple(self.own(*part)) for part in zip(*columns)])
        return outs[0] if len(outs) == 1 else outs

    def _each(self, *args):
        return self.each(args)

    def parts(self, a: torch.Tensor, i: int) -> tuple:
        """Input ``i``'s rows of each replica (views; one call)."""
        rows = self.rows[i]
        return a.unbind() if rows is None else a.split(rows)

    def join(self, results: Sequence[tuple]) -> tuple:
        """Every replica's outputs (``results[r][j]``) as rows (None where not made)."""
        outs: List[Any] = []
        for j, shape in enumerate(self.shapes):
            col = [res[j] for res in results]
            outs.append(None if col[0] is None else (torch.cat(col) if shape else torch.stack(col)))
        return tuple(outs)

    def stacked(self, args: Sequence[tuple]) -> tuple:
        """The inputs of every replica (``args[r][i]``) as rows; an input without rows is
        the first replica's (one memory for all)."""
        return tuple(
            [torch.cat([a[i] for a in args]) if p else args[0][i] for i, p in enumerate(self.per)]
        )

    def split(self, result) -> List[tuple]:
        """A result over the rows as every replica's outputs (``[r][j]``)."""
        r = self.replicas
        parts = [
            (None,) * r if t is None else t.reshape(r, *shape).unbind()
            for t, shape in zip(as_tuple(result), self.shapes)
        ]
        return list(zip(*parts))

    def reset(self) -> None:
        """STEP: check again at the next call."""
        self.chosen = None
        self.checked.clear()
        self.namespace[self.name] = self

    def _first_call(self, args: tuple):
        """STEP: each form against the replicas' own calls, bit for bit, until one matches;
        from then on the generated code calls that one (or the replicas' calls, where none
        did) directly."""
        want = self.each(args)
        chosen: Callable = self._each
        found = self.check((), args, as_tuple(want))
        if found is not None:
            if self.together is not None:  # the group checks the values it computes
                self.together.wanted(self.op, as_tuple(want))
            chosen, want = found  # what later runs compute: its layout downstream
        if self.reduced is not None:  # outputs only an all-reduce reads: its result
            want, chosen = self.reduced.check(args, as_tuple(want), chosen)
        self.chosen = chosen
        self.namespace[self.name] = chosen
        return want


class StackRequest:
    """What a replica waiting at a `RowsAt.CALL` site hands the hub."""

    __slots__ = ("site", "args")

    def __init__(self, site: BatchedSite, args: tuple) -> None:
        self.site = site
        self.args = args


# the op's forms over the rows, from its rule --------------------------------------------
def rule_forms(
    op: Op, em, facts: SiteFacts, per, replicas: int, buffers: Optional[dict]
) -> Tuple[List[Callable], Callable, frozenset]:
    """``(forms, base, dead)``: the calls over all replicas' rows the op's rule allows
    (`folded_calls`; none where its operands are not plain float32), over ``base``, the
    table kernel or its variant skipping the outputs ``dead`` (`base_kernel`)."""
    base, dead = base_kernel(op, em, facts.dead if facts.plain else frozenset())
    forms = folded_calls(op, base, replicas, per, dead, buffers) if facts.plain else []
    return forms, base, dead


def base_kernel(op: Op, em, dead: frozenset) -> Tuple[Callable, frozenset]:
    """The table kernel, or its variant skipping the outputs nothing reads."""
    variant = DEAD_OUTPUT_KERNELS.get(op.opdef, {}).get(dead) if dead else None
    if variant is not None:
        return variant, dead
    sizes = [t.nelms for t in op.inputs]
    kernel = op.opdef.kernel_for(em.program.ir.numerics, sizes)
    assert kernel is not None  # a batched op is a table op with a kernel
    return kernel, frozenset()


def folded_calls(
    op: Op, base: Callable, replicas: int, per, dead: frozenset, buffers: Optional[dict]
) -> List[Callable]:
    """The calls over all replicas' rows (``per``: which inputs have rows) the op's
    `ReplicaFold` allows, to try in order (none: the fallback alone); ``base``:
    `base_kernel`'s kernel, ``dead`` its skipped outputs; ``buffers``: a dict its own
    kernels may keep outputs in."""
    rule = fold_rule(op.opdef)
    if rule is None or not rows_fold(op, rule, per):
        return []
    if rule.kernels:
        return [_own_folded(k, replicas, dead, buffers, op.attrs) for k in rule.kernels]
    attrs = folded_attrs(op, rule, replicas)
    return [functools.partial(base, **attrs) if attrs else base]


def rows_fold(op: Op, rule, per) -> bool:
    """Whether ``rule`` folds ``op`` over all replicas' rows (``per``: which inputs have
    rows): each such input has rows, and a rank-0 output of one replica (a loss) is R
    values, which only a kernel of the op's own makes."""
    shapes = [tuple(t.shape) for t in op.inputs]
    if not all(s for s, p in zip(shapes, per) if p):
        return False
    if any(not t.shape for t in op.outputs) and not rule.kernels:
        return False
    return rule.rows(op.attrs, shapes, per)


def folded_attrs(op: Op, rule, replicas: int) -> dict:
    """The op's attributes for all replicas' rows in one call."""
    return rule.attrs(op.attrs, replicas) if rule.attrs is not None else op.attrs


def _own_folded(kernel: Callable, replicas: int, dead, buffers, attrs) -> Callable:
    return lambda *args: kernel(args, replicas, dead, buffers, **attrs)
