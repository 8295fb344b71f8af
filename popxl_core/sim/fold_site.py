"""An op of a folded graph (`fold.py`) with per-replica inputs: one call for all replicas.

A `FoldSite` holds two ways to compute the op over the replicas' rows (per-replica values
concatenated along dim 0): the *folded* call (the kernel on the concatenated rows, with the
attributes its `speed.ReplicaBatching.fold` gives, or its own folded kernel), and the
*replicas' calls* (each replica's own kernel on its rows, outputs concatenated: the
unfolded run's calls on the same values; a replica's rows have the strides its own tensor
has, dim 0 being outermost). A GEMM's or a reduction's rows need not come out the same bits at R*b
rows as at b (MKL picks kernels per shape and CPU), so at its first call a site computes
both, trying the op's folded forms in order, and compares bit for bit; it keeps the first
folded form whose every output matched, else the replicas' calls. A compiled graph meets the
same shapes and strides at every run (its kernels lay out their outputs alike each time), so
the generated code then calls the chosen function directly (no per-call cost); a run with
another thread count checks again (`FoldRuntime.start`). Data alignment is not checked
again: host transfers' buffers vary in their alignment past 16 bytes from run to run, and a
GEMM packs its operands (as `stacking.py` found).
"""

from __future__ import annotations

import copy
import functools
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from ..graph import Op
from .bits import Checked, as_tuple
from .fold_reduce import ReducedOutputs, ReduceGroups
from .speed import DEAD_OUTPUT_KERNELS, fold_rule, known_fold
from .variants import site_facts

__all__ = ["FoldSite", "base_kernel", "emit_exact", "emit_folded_main", "folded_calls"]


def emit_folded_main(op: Op, plan, em, emit_kernel: Callable) -> bool:
    """Emit ``op`` of a folded program's main graph where folding decides how (True), else
    leave it to the compiler (False): an ``out=`` reuse of a per-replica tensor's storage
    is not made (its shape is all replicas'), and the all-reduces are sums over the
    replicas' rows (`fold_reduce.py`). ``emit_kernel``: the compiler's default emission."""
    fold = em.program.fold
    if op in plan.reuse and plan.reuse[op] in fold.stacked:
        (op.opdef.emit or emit_kernel)(op, em)
        return True
    if op in fold.fused:  # its input is already its result (`fold_reduce.plan_fused`)
        em.emit(f"{em.name(op.outputs[0])} = {em.name(op.inputs[0])}")
        return True
    return _emit_reduce_group(op, plan, em, fold)


def _emit_reduce_group(op: Op, plan, em, fold) -> bool:
    """A run of consecutive all-reduces as one call at its first op (`fold_reduce.py`)."""
    if em.graph not in fold.reduce_groups:
        fold.reduce_groups[em.graph] = ReduceGroups(plan.live, fold)
    groups = fold.reduce_groups[em.graph]
    if op in groups.member:  # computed at its run's first op
        return True
    run = groups.first.get(op)
    if run is None:
        return False
    outs = ", ".join(em.name(x.outputs[0]) for x in run)
    ins = ", ".join(em.name(x.inputs[0]) for x in run)
    kind, key = op.attrs["op"], f"{op.type}.{op.id}"
    keep = site_facts(op, em).keeps  # its results are dead by the next run
    em.emit(f"{outs}, = RT.all_reduce_group(({ins},), {kind!r}, {key!r}, {keep})")
    return True


def emit_exact(op: Op, em, fold, emit_kernel: Callable) -> bool:
    """An op whose `ReplicaFold.exact` folded call applies: emitted as the compiler emits
    the op itself (inline where `speed.DIRECT` allows), with the folded attributes."""
    rule = fold_rule(op.opdef)
    if rule is None or not rule.exact or rule.kernels or not site_facts(op, em).plain:
        return False
    if not _rows_fold(op, rule, [t in fold.stacked for t in op.inputs]):
        return False
    folded = copy.copy(op)  # the same tensors, the attributes of all replicas' rows
    folded.attrs = _folded_attrs(op, rule, fold.replicas)
    emit_kernel(folded, em)
    em.program.stats["exact_folded_ops"] += 1
    return True


class FoldSite:
    """``op`` over all replicas' rows: folded where checked equal, else per replica."""

    def __init__(self, op: Op, em, fold, bound_kernel: Callable) -> None:
        self.replicas = fold.replicas
        self.per = tuple(t in fold.stacked for t in op.inputs)
        # per input: its rows on one replica (None: a rank-0 value, one element a replica)
        self.rows = tuple(t.shape[0] if len(t.shape) else None for t in op.inputs)
        self.scalar_out = tuple(len(t.shape) == 0 for t in op.outputs)
        self.n_out = len(op.outputs)
        self.op = op
        facts = self.facts = site_facts(op, em)
        plain = facts.plain
        base, self.dead = base_kernel(op, em, facts.dead if plain else frozenset())
        attrs = op.kernel_attrs()
        self.own = functools.partial(base, **attrs) if attrs else base
        if not plain:  # the table kernel with its dtype wrappers
            self.own = bound_kernel(op, em)
        r, buffers = self.replicas, facts.buffers()
        self.folded = folded_calls(op, base, r, self.per, self.dead, buffers) if plain else None
        self.together = _together(op, self, fold, plain)
        self.reduced = _reduced(op, self, em, fold, plain)
        # a compiled graph meets one set of shapes and strides: one key (`reset` clears it)
        self.checked = Checked(self.folded or ())
        self.chosen: Optional[Callable] = None  # the call checked equal (or `_each`)
        self.name = ""  # its global in the generated code
        self.namespace: Dict[str, Any] = {}

    def __call__(self, *args):
        """The first call: each folded call against the replicas' calls, bit for bit, until
        one matches; from then on the generated code calls that one (or the replicas' calls,
        where none did) directly: a compiled graph meets the same shapes and strides every
        run, and `reset` undoes it where the thread count changes."""
        want = self.each(args)
        chosen: Callable = self._each
        found = self.checked.check((), args, self._left(as_tuple(want)))
        if found is not None:
            if self.together is not None:  # the group checks the values it computes
                self.together.wanted(self.op, as_tuple(want))
            chosen, want = found  # what later runs compute: its layout downstream
        if self.reduced is not None:  # outputs only an all-reduce reads: its result
            want, chosen = self.reduced.check(args, as_tuple(want), chosen)
        self.chosen = chosen
        self.namespace[self.name] = chosen
        return want

    def _left(self, want: tuple) -> tuple:
        """The outputs the folded calls compute: all but those computed at the group."""
        if self.together is None:
            return want
        skip = self.together.outputs
        return tuple(None if j in skip else w for j, w in enumerate(want))

    def reset(self) -> None:
        """Check again at the next call."""
        self.chosen = None
        self.checked.clear()
        self.namespace[self.name] = self

    def _each(self, *args):
        return self.each(args)

    def each(self, args: tuple):
        """Every replica's own call on its rows, outputs concatenated in replica order."""
        r = self.replicas
        columns = [
            self._parts(a, i) if p else (a,) * r for i, (a, p) in enumerate(zip(args, self.per))
        ]
        results = [as_tuple(self.own(*part)) for part in zip(*columns)]
        outs: List[Any] = []
        for j in range(self.n_out):
            col = [res[j] for res in results]
            if col[0] is None:
                outs.append(None)
            else:
                outs.append(torch.stack(col) if self.scalar_out[j] else torch.cat(col))
        return outs[0] if self.n_out == 1 else tuple(outs)

    def _parts(self, a: torch.Tensor, i: int) -> tuple:
        """Input ``i``'s rows of each replica (views; one call)."""
        rows = self.rows[i]
        return a.unbind() if rows is None else a.split(rows)


def base_kernel(op: Op, em, dead: frozenset) -> Tuple[Callable, frozenset]:
    """The table kernel, or its variant skipping the outputs nothing reads."""
    variant = DEAD_OUTPUT_KERNELS.get(op.opdef, {}).get(dead) if dead else None
    if variant is not None:
        return variant, dead
    sizes = [t.nelms for t in op.inputs]
    kernel = op.opdef.kernel_for(em.program.ir.numerics, sizes)
    assert kernel is not None  # a folded op is a table op with a kernel
    return kernel, frozenset()


def folded_calls(
    op: Op, base: Callable, replicas: int, per, dead: frozenset, buffers: Optional[dict]
) -> Optional[List[Callable]]:
    """The calls over all replicas' rows (``per``: which inputs are per replica) the op's
    `ReplicaFold` allows, to try in order, or None; ``base``: `base_kernel`'s kernel,
    ``dead`` its skipped outputs; ``buffers``: a dict its own kernels may keep outputs in."""
    rule = fold_rule(op.opdef)
    if rule is None or not _rows_fold(op, rule, per):
        return None
    if rule.kernels:
        return [_own_folded(k, replicas, dead, buffers, op.attrs) for k in rule.kernels]
    attrs = _folded_attrs(op, rule, replicas)
    return [functools.partial(base, **attrs) if attrs else base]


def _rows_fold(op: Op, rule, per) -> bool:
    """Whether ``rule`` folds ``op`` over all replicas' rows (``per``: which inputs are
    per replica): each such input has rows, and a rank-0 output of one replica (a loss) is
    R values, which only a kernel of the op's own makes."""
    shapes = [tuple(t.shape) for t in op.inputs]
    if not all(s for s, p in zip(shapes, per) if p):
        return False
    if any(not t.shape for t in op.outputs) and not rule.kernels:
        return False
    return rule.rows(op.attrs, shapes, per)


def _folded_attrs(op: Op, rule, replicas: int) -> dict:
    """The op's attributes for all replicas' rows in one call."""
    return rule.attrs(op.attrs, replicas) if rule.attrs is not None else op.attrs


def _together(op: Op, site: FoldSite, fold, plain: bool):
    """The op's `fold_together.Together`, where its outputs are computed at the group: the
    site's folded call is then the op's ``rest`` (leaving its operands there)."""
    together = fold.together.get(op)
    if together is None or not plain or site.folded is None:
        return None
    rule = known_fold(op.opdef)
    r, attrs, rest, dead = site.replicas, op.attrs, rule.rest, site.dead
    together.sites[op] = site

    def call(*args):
        together.put(op, args)
        return rest(args, r, dead, **attrs)

    site.folded = [call]
    return together


def _reduced(op: Op, site: FoldSite, em, fold, plain: bool) -> Optional[ReducedOutputs]:
    """The site's outputs an all-reduce alone reads, returned all-reduced (`plan_fused`)."""
    kinds = fold.reduced.get(op)
    if kinds is None:
        return None
    # `plan_fused` reduces only the outputs of ops with a fold rule (`sole_graph_source`)
    rule, r = known_fold(op.opdef), site.replicas
    calls = []
    if plain and rule.rows(op.attrs, [tuple(t.shape) for t in op.inputs], site.per):
        buffers = site.facts.buffers()
        calls = [_own_reduced(k, r, site.dead, buffers, kinds, op.attrs) for k in rule.reduced]
    return ReducedOutputs(kinds, r, calls, site.facts.keeps)


def _own_reduced(kernel: Callable, replicas: int, dead, buffers, kinds, attrs) -> Callable:
    return lambda *args: kernel(args, replicas, dead, buffers, kinds, **attrs)


def _own_folded(kernel: Callable, replicas: int, dead, buffers, attrs) -> Callable:
    return lambda *args: kernel(args, replicas, dead, buffers, **attrs)
