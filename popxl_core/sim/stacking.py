"""Replicas in lock step computing one op as one kernel: a GEMM of a shared weight over all
the replicas' rows.

With R data-parallel replicas every replica runs the same graphs over its 1/R of the batch.
Where `uniform.py` makes the weights one tensor for all replicas, each replica's forward and
input-gradient GEMM still reads the whole weight for its few rows: at the seed MLP's 8 rows
a replica, R reads of 1.3 M weights were most of a replication-4 step. Here an op whose
`speed.ReplicaBatching.stack` (`forms.ReplicaStack`) names its shared inputs, emitted as a
`batched_site.BatchedSite` whose rows are made per call (`RowsAt.CALL`, `stack_site`), meets
the other replicas at the lock-step hub (`lockstep.py`, like a collective without data
exchange); when every replica is at the same op with the ``shared`` inputs in
the same memory, the hub computes the op's outputs for all of them with the op's ``fold``
forms (`forms.ReplicaFold`, as a folded program calls them) over the replicas' other inputs
concatenated along dim 0 (same shapes on every replica), and each replica gets its part.

Bits: a GEMM's row need not come out the same whatever rows it is computed with (MKL picks
kernels per shape and CPU). So the first time a site meets a set of shapes (and strides,
alignments, thread count) the hub also runs every replica's own kernel and compares bit for
bit; the stacked form is used for those shapes only where every replica's output matched,
else each replica runs its own kernel, as it does wherever the replicas are not at the same
op, a shared input differs (an unshared run, a host write, an RTS shard), or a replica has
finished. ``CompileOptions(stack_replicas=False)`` switches it off; tests compare both.
"""

from __future__ import annotations

from typing import Callable, List, Optional, Sequence

import torch

from ..graph import Op
from .batched_site import BatchedSite, RowsAt, StackRequest, rule_forms
from .speed import stack_rule
from .variants import bounded, site_facts

__all__ = ["MIN_SHARED_BYTES", "stack_site", "stacked_values"]

# below this many bytes of shared inputs a weight stays in cache between the replicas' calls:
# the hub round (greenlet switches, copies to stack the inputs) then costs more than it saves
# (GPT's 32x128 projections: 2.7x -> 2.8x the one-replica step; the seed MLP's 1-1.6 MB
# weights: 2.6x -> 2.2x, loaded 2-core AMD EPYC)
MIN_SHARED_BYTES = 256 * 1024


def stack_site(op: Op, em, bound_kernel: Callable) -> Optional[BatchedSite]:
    """The op as a `RowsAt.CALL` site over its kernel (``bound_kernel(op, em)``, made only
    for a site) where its rule and use allow, else None; asked only in a program whose
    replicas may stack (`batching.emit_batched`). Its forms are the op's ``fold`` forms
    over the replicas' unshared inputs concatenated along dim 0, as a folded program holds
    them."""
    rule = stack_rule(op.opdef)
    if rule is None:
        return None
    facts = site_facts(op, em)
    if len(facts.dead) == len(op.outputs) or not facts.plain:
        return None
    shared = [op.inputs[i] for i in rule.shared if i < len(op.inputs)]
    if sum(t.spec.nbytes for t in shared) < MIN_SHARED_BYTES:
        return None
    runtime = em.program.namespace["RT"]
    per = tuple(i not in rule.shared for i in range(len(op.inputs)))
    # output buffers kept between runs where the op runs at most once per run of each
    # replica (what `variants.py` keeps per replica, kept here for the stacked call)
    buffers = facts.buffers() if facts.keeps and bounded(op) else None
    replicas = len(runtime.local)
    forms, _, _ = rule_forms(op, em, facts, per, replicas, buffers)
    if not forms:
        return None
    own = bound_kernel(op, em)
    site = BatchedSite(op, RowsAt.CALL, facts, own, per, forms, replicas, skip=facts.dead)
    site.runtime = runtime
    return site


def stacked_values(
    requests: Sequence[object], own: Callable[[int, StackRequest], tuple]
) -> Optional[List[tuple]]:
    """Every replica's outputs from one call over their rows, or None (each replica
    computes its own): ``requests`` holds what each replica waits at; ``own(replica,
    request)`` runs that replica's own kernel (for the bit check the first time a site
    meets a set of shapes)."""
    reqs = [q for q in requests if isinstance(q, StackRequest)]
    # the leader's and followers' main graphs (uniform.py) bind a site each per op
    if len(reqs) != len(requests) or any(q.site.op is not reqs[0].site.op for q in reqs):
        return None
    site, args = reqs[0].site, [q.args for q in reqs]
    if not _stackable(args, site.per):
        return None
    key, checked = _key(args), site.checked
    if key in checked:
        form = checked.form(key)
        return None if form is None else site.split(form(*site.stacked(args)))
    want = site.join([own(r, q) for r, q in enumerate(reqs)])
    found = site.check(key, site.stacked(args), want)
    return None if found is None else site.split(found[1])


def _stackable(args: List[tuple], per: Sequence[bool]) -> bool:
    """The shared inputs (without rows) are the same memory on every replica; the others
    have the same shape (they stack)."""
    first = args[0]
    for i, t in enumerate(first):
        if not per[i]:
            if any(not _same_memory(t, a[i]) for a in args[1:]):
                return False
        elif t.dim() == 0 or any(a[i].shape != t.shape for a in args[1:]):
            return False
    return True


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a is b or (
        a.data_ptr() == b.data_ptr()
        and a.shape == b.shape
        and a.stride() == b.stride()
        and a.dtype == b.dtype
    )


def _key(args: List[tuple]) -> tuple:
    """What may change the kernel torch picks: shapes, strides, threads, and alignment to
    16 bytes (host streams' numpy buffers vary in their alignment to 64 from run to run;
    a GEMM packs its operands, so alignment past the vector width changes no arithmetic)."""
    return (torch.get_num_threads(),) + tuple(
        (tuple(t.shape), t.stride(), t.data_ptr() % 16) for a in args for t in a
    )
