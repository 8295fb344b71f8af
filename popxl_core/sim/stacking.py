"""Replicas in lock step computing one op as one kernel: a GEMM of a shared weight over all
the replicas' rows.

With R data-parallel replicas every replica runs the same graphs over its 1/R of the batch.
Where `uniform.py` makes the weights one tensor for all replicas, each replica's forward and
input-gradient GEMM still reads the whole weight for its few rows: at the seed MLP's 8 rows
a replica, R reads of 1.3 M weights were most of a replication-4 step. Here an op whose
`speed.ReplicaBatching.stack` (`forms.ReplicaStack`) names its shared inputs, emitted as a
`StackSite`, meets the other replicas at the lock-step hub (`lockstep.py`, like a collective
without data exchange); when every replica is at the same op with the ``shared`` inputs in
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

from typing import Any, Callable, List, Optional, Sequence

import torch

from ..graph import Op
from .bits import Checked, as_tuple
from .fold_site import base_kernel, folded_calls
from .speed import stack_rule
from .variants import SiteFacts, bounded, site_facts

__all__ = ["MIN_SHARED_BYTES", "StackRequest", "StackSite", "stack_site", "stacked_values"]

# below this many bytes of shared inputs a weight stays in cache between the replicas' calls:
# the hub round (greenlet switches, copies to stack the inputs) then costs more than it saves
# (GPT's 32x128 projections: 2.7x -> 2.8x the one-replica step; the seed MLP's 1-1.6 MB
# weights: 2.6x -> 2.2x, loaded 2-core AMD EPYC)
MIN_SHARED_BYTES = 256 * 1024


class StackSite:
    """An op's kernel as called by a replica: alone, or stacked at the lock-step hub."""

    def __init__(
        self,
        op: Op,
        kernel: Callable,
        forms: Sequence[Callable],
        shared: Sequence[int],
        runtime,
        facts: SiteFacts,
    ) -> None:
        self.op = op  # the leader's and followers' main graphs bind a site each per op
        self.kernel = kernel  # the replica's own: the fallback
        self.shared = tuple(shared)  # the inputs one memory on every replica (the weights)
        self.runtime = runtime
        self.facts = facts  # `variants.site_facts`: the analysis a fold site reads too
        self.live = tuple(i not in facts.dead for i in range(len(op.outputs)))
        # stacked forms (every replica's arguments -> every replica's outputs), checked per
        # shapes, strides, alignment and threads (`_key`) on the outputs some op reads
        self.checked = Checked(forms, outputs=self.read)

    def __call__(self, *args):
        hub = self.runtime.stack_hub()
        value = None if hub is None else hub.switch(StackRequest(self, args))  # it answers
        if value is None:
            return self.kernel(*args)
        return value[0] if len(value) == 1 else tuple(value)

    def own_outputs(self, args) -> tuple:
        """This replica's outputs by its own kernel (the fallback, for the check)."""
        return as_tuple(self.kernel(*args))

    def read(self, values: Sequence[tuple]) -> tuple:
        """Every replica's outputs that some op reads, in order."""
        return tuple(t for v in values for t, use in zip(v, self.live) if use)


class StackRequest:
    """What a replica waiting at a `StackSite` hands the hub."""

    __slots__ = ("site", "args")

    def __init__(self, site: StackSite, args: tuple) -> None:
        self.site = site
        self.args = args


def stack_site(op: Op, em, bound_kernel: Callable) -> Optional[StackSite]:
    """The op as a `StackSite` over its kernel (``bound_kernel(op, em)``, made only for a
    site) where its rule and use allow, else None; asked only in a program whose replicas
    may stack (`batching.emit_batched`)."""
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
    forms = _fold_forms(op, em, rule.shared, facts, len(runtime.local))
    if not forms:
        return None
    return StackSite(op, bound_kernel(op, em), forms, rule.shared, runtime, facts)


def _fold_forms(op: Op, em, shared, facts: SiteFacts, replicas: int) -> List[Callable]:
    """The op's ``fold`` forms (`fold_site.folded_calls`) as stacked forms: each over the
    replicas' unshared inputs concatenated along dim 0 (the rows a folded program holds),
    each replica given its part of every output (a folded output is the replicas' values
    one after the other along dim 0)."""
    per = tuple(i not in shared for i in range(len(op.inputs)))
    base, dead = base_kernel(op, em, facts.dead)
    # output buffers kept between runs where the op runs at most once per run of each
    # replica (what `variants.py` keeps per replica, kept here for the stacked call)
    buffers = facts.buffers() if facts.keeps and bounded(op) else None
    calls = folded_calls(op, base, replicas, per, dead, buffers) or []
    shapes = [tuple(t.shape) for t in op.outputs]
    return [_stacked(call, per, shapes) for call in calls]


def _stacked(call: Callable, per: Sequence[bool], shapes: Sequence[tuple]) -> Callable:
    def stacked(args: Sequence[tuple]) -> List[tuple]:
        ins = [torch.cat([a[i] for a in args]) if p else args[0][i] for i, p in enumerate(per)]
        r = len(args)
        parts = [
            (None,) * r if t is None else t.reshape(r, *shape).unbind()
            for t, shape in zip(as_tuple(call(*ins)), shapes)
        ]
        return list(zip(*parts))

    return stacked


def stacked_values(
    requests: Sequence[Any], own: Callable[[int, StackRequest], tuple]
) -> Optional[List[tuple]]:
    """Every replica's outputs from one stacked kernel, or None (each replica computes its
    own): ``requests`` holds what each replica waits at; ``own(replica, request)`` runs that
    replica's own kernel (for the bit check the first time a site meets a set of shapes)."""
    first = requests[0]
    if not isinstance(first, StackRequest):
        return None
    if any(not isinstance(q, StackRequest) or q.site.op is not first.site.op for q in requests):
        return None
    site = first.site
    args = [q.args for q in requests]
    if not _stackable(args, site.shared):
        return None
    key, checked = _key(args), site.checked
    if key in checked:
        form = checked.form(key)
        return None if form is None else form(args)
    want = site.read([own(r, q) for r, q in enumerate(requests)])
    found = checked.check(key, (args,), want)
    return None if found is None else found[1]


def _stackable(args: List[tuple], shared: Sequence[int]) -> bool:
    """The shared inputs are the same memory on every replica; the others have the same
    shape (they stack)."""
    first = args[0]
    for i, t in enumerate(first):
        if i in shared:
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
