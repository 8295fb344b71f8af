"""A folded program's ops (`fold.py`): how each op of its graphs is emitted.

An op of a folded graph with a per-replica input is a `batched_site.BatchedSite` whose rows
the folded program holds for the whole step (`RowsAt.STEP`, made by `fold_site`): its
rule's forms over all replicas' rows, checked bit for bit against each replica's own call
at the first call, then the chosen call bound in its place. Where the rule's ``exact`` fold
applies, the op is emitted as its own code with the folded attributes, unchecked
(`emit_exact`). In the main graph the all-reduces are sums over the replicas' rows
(`emit_folded_main`, each as its `fold_reduce.ReduceBy` says).
"""

from __future__ import annotations

import copy
import functools
from typing import Callable, Optional

from ..graph import Op
from .batched_site import BatchedSite, RowsAt, folded_attrs, rows_fold, rule_forms
from .fold_reduce import ReduceBy, ReducedOutputs
from .speed import fold_rule, known_fold
from .variants import site_facts

__all__ = ["emit_exact", "emit_folded_main", "fold_site"]


def emit_folded_main(op: Op, plan, em, emit_kernel: Callable) -> bool:
    """Emit ``op`` of a folded program's main graph where folding decides how (True), else
    leave it to the compiler (False): an ``out=`` reuse of a per-replica tensor's storage
    is not made (its shape is all replicas'), and the all-reduces are as their
    `fold_reduce.ReduceBy` says. ``emit_kernel``: the compiler's default emission."""
    fold = em.program.fold
    if op in plan.reuse and plan.reuse[op] in fold.stacked:
        (op.opdef.emit or emit_kernel)(op, em)
        return True
    by = fold.reduce_by.get(op)
    if by is ReduceBy.SITE:  # its input is already its result
        em.emit(f"{em.name(op.outputs[0])} = {em.name(op.inputs[0])}")
    elif by is ReduceBy.GROUP and op in fold.runs:  # the others are computed here
        _emit_reduce_group(op, fold.runs[op], em)
    return by is not None


def _emit_reduce_group(op: Op, run, em) -> None:
    """A run of consecutive all-reduces as one call at its first op (`fold_reduce.py`)."""
    outs = ", ".join(em.name(x.outputs[0]) for x in run)
    ins = ", ".join(em.name(x.inputs[0]) for x in run)
    kind, key = op.attrs["op"], f"{op.type}.{op.id}"
    keep = site_facts(op, em).keeps  # its results are dead by the next run
    em.emit(f"{outs}, = RT.all_reduce_group(({ins},), {kind!r}, {key!r}, {keep})")


def emit_exact(op: Op, em, fold, emit_kernel: Callable) -> bool:
    """An op whose `ReplicaFold.exact` folded call applies: emitted as the compiler emits
    the op itself (inline where `speed.DIRECT` allows), with the folded attributes."""
    rule = fold_rule(op.opdef)
    if rule is None or not rule.exact or rule.kernels or not site_facts(op, em).plain:
        return False
    if not rows_fold(op, rule, [t in fold.stacked for t in op.inputs]):
        return False
    folded = copy.copy(op)  # the same tensors, the attributes of all replicas' rows
    folded.attrs = folded_attrs(op, rule, fold.replicas)
    emit_kernel(folded, em)
    em.program.stats["exact_folded_ops"] += 1
    return True


def fold_site(op: Op, em, fold, bound_kernel: Callable) -> BatchedSite:
    """``op`` of a folded graph with a per-replica input as a `RowsAt.STEP` site: its
    rule's forms where the op is float32 without dtype wrappers, else the fallback alone
    (``bound_kernel(op, em)``: the table kernel with its dtype wrappers); some outputs made
    at the group of all-reduces reading them (`fold_together.py`) or returned all-reduced
    (`fold_reduce.plan_fused`)."""
    facts, r = site_facts(op, em), fold.replicas
    per = tuple(t in fold.stacked for t in op.inputs)
    forms, base, dead = rule_forms(op, em, facts, per, r, facts.buffers())
    attrs = op.kernel_attrs()
    own = functools.partial(base, **attrs) if attrs else base
    together = fold.together.get(op) if forms else None
    if not facts.plain:
        own = bound_kernel(op, em)
    if together is not None:  # the site's call is the op's ``rest``: the others at the group
        forms = [_rest(op, together, r, dead)]
    skip = frozenset(together.outputs) if together is not None else frozenset()
    site = BatchedSite(op, RowsAt.STEP, facts, own, per, forms, r, skip)
    if together is not None:
        site.together, together.sites[op] = together, site
    site.reduced = _reduced(op, site, fold, dead)
    return site


def _rest(op: Op, together, replicas: int, dead: frozenset) -> Callable:
    """The op's `ReplicaFold.rest`, leaving its operands with ``together``."""
    rest, attrs = known_fold(op.opdef).rest, op.attrs

    def call(*args):
        together.put(op, args)
        return rest(args, replicas, dead, **attrs)

    return call


def _reduced(op: Op, site: BatchedSite, fold, dead: frozenset) -> Optional[ReducedOutputs]:
    """The site's outputs an all-reduce alone reads, returned all-reduced (`plan_fused`)."""
    kinds = fold.reduced.get(op)
    if kinds is None:
        return None
    # `plan_fused` reduces only the outputs of ops with a fold rule (`sole_graph_source`)
    rule, r = known_fold(op.opdef), site.replicas
    calls = []
    if site.facts.plain and rule.rows(op.attrs, [tuple(t.shape) for t in op.inputs], site.per):
        buffers = site.facts.buffers()
        calls = [_own_reduced(k, r, dead, buffers, kinds, op.attrs) for k in rule.reduced]
    return ReducedOutputs(kinds, r, calls, site.facts.keeps)


def _own_reduced(kernel: Callable, replicas: int, dead, buffers, kinds, attrs) -> Callable:
    return lambda *args: kernel(args, replicas, dead, buffers, kinds, **attrs)
