"""Replicas in lock step computing one op as one kernel: a GEMM of a shared weight over all
the replicas' rows.

With R data-parallel replicas every replica runs the same graphs over its 1/R of the batch.
Where `uniform.py` makes the weights one tensor for all replicas, each replica's forward and
input-gradient GEMM still reads the whole weight for its few rows: at the seed MLP's 8 rows
a replica, R reads of 1.3 M weights were most of a replication-4 step. Here an op whose
`speed.ReplicaBatching.stack` (`forms.ReplicaStack`) says how, emitted as a `StackSite`, meets the
other replicas at the lock-step hub (`lockstep.py`, like a collective without data exchange);
when every replica is at the same op with the ``shared`` inputs in the same memory, the hub
computes the op's outputs for all of them with one kernel over the replicas' other inputs
stacked (same shapes on every replica), and each replica gets its part.

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
from ..ops.forms import ReplicaStack
from .bits import Checked
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
        self, op: Op, kernel: Callable, rule: ReplicaStack, runtime, facts: SiteFacts
    ) -> None:
        self.op = op  # the leader's and followers' main graphs bind a site each per op
        self.kernel = kernel
        self.rule = rule
        self.attrs = dict(op.attrs)
        self.runtime = runtime
        self.facts = facts  # `variants.site_facts`: the analysis a fold site reads too
        self.live = tuple(i not in facts.dead for i in rule.outputs)
        # output buffers kept between runs where the op runs at most once per run of each
        # replica (what `variants.py` keeps per replica, kept here for the stacked call)
        self.buffers = facts.buffers() if facts.keeps and bounded(op) else None
        # shapes, strides, alignment, threads (`_key`) -> the stacked form gave every
        # replica's bits (the outputs some op reads)
        self.checked = Checked([self.stacked], outputs=self.read)

    def __call__(self, *args):
        hub = self.runtime.stack_hub()
        if hub is None:
            return self.kernel(*args)
        value = hub.switch(StackRequest(self, args))  # the hub answers
        if value is None:
            return self.kernel(*args)
        if self.rule.rest is None:
            return value[0] if len(value) == 1 else value
        result = list(self.rule.rest(self.kernel, args))
        for i, v in zip(self.rule.outputs, value):
            result[i] = v
        return tuple(result)

    def own_outputs(self, args) -> tuple:
        """The outputs the stacked call computes, by this replica's own kernel."""
        res = self.kernel(*args)
        res = res if isinstance(res, tuple) else (res,)
        return tuple(res[i] for i in self.rule.outputs)

    def stacked(self, args: List[tuple]) -> List[tuple]:
        return self.rule.stacked(args, self.live, self.buffers, **self.attrs)

    def read(self, values: Sequence[tuple]) -> tuple:
        """Every replica's outputs (of the stacked call's) that some op reads, in order."""
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
    if all(i in facts.dead for i in rule.outputs) or not facts.plain:
        return None
    shared = [op.inputs[i] for i in rule.shared if i < len(op.inputs)]
    if sum(t.spec.nbytes for t in shared) < MIN_SHARED_BYTES:
        return None
    return StackSite(op, bound_kernel(op, em), rule, em.program.namespace["RT"], facts)


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
    if not _stackable(args, site.rule.shared):
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
