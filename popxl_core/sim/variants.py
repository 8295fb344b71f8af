"""Op-table kernel variants the compiler picks from what it knows about an op's use.

``speed.DEAD_OUTPUT_KERNELS``: a kernel that skips outputs nothing reads (a first
linear layer's input gradient). ``speed.BUFFERED_KERNEL``: a kernel that writes its
outputs into buffers it keeps between runs, used only for an op of a graph that runs at most
once per `Session.run` (every value a run computes is dead when the run returns: it returns
copies, and variables are written in place), so no value is overwritten while still read.
Both compute the outputs they return with the same calls as the table kernel: same bits
(tests/test_dead_outputs.py, tests/test_reference_fused.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Set

import torch

from ..graph import Graph, Op
from ..ops.call import CALL
from ..ops.remote import REMOTE_LOAD, REMOTE_LOAD_INPLACE
from .kernel_wrappers import fp16_in_fp32, touches_narrow_unsigned
from .speed import BUFFERED_KERNEL, DEAD_OUTPUT_KERNELS

__all__ = [
    "MAX_BUFFER_BYTES",
    "SiteFacts",
    "all_float32",
    "bounded",
    "buffer_graphs",
    "graphs_run_once",
    "site_facts",
    "variant_kernel",
]


@dataclass(frozen=True)
class SiteFacts:
    """What the compiler knows about one op's use, from which its kernel variants and its
    replica-batched site (batching.py: folded or stacked) are decided; found once per op
    by `site_facts`."""

    # float32 operands (integer ones pass) and no dtype wrapper: a variant or batched form
    # is the table kernel's own arithmetic
    plain: bool
    dead: frozenset  # indexes of the outputs nothing reads (a variant need not make them)
    # its graph runs at most once per run of each replica (and not under inductor, whose
    # compiled graphs allocate their outputs): output buffers may be kept between runs
    keeps: bool

    def buffers(self) -> Optional[dict]:
        """A dict a kernel may keep its output buffers in between runs, or None."""
        return {} if self.keeps else None


def site_facts(op: Op, em) -> SiteFacts:
    """``op``'s `SiteFacts` in the graph ``em`` emits."""
    program = em.program
    plain = all_float32(op) and not fp16_in_fp32(op) and not touches_narrow_unsigned(op)
    dead = frozenset(i for i, t in enumerate(op.outputs) if t not in em.read)
    keeps = not program.options.inductor and em.graph in program.keeps_buffers
    return SiteFacts(plain, dead, keeps)


def variant_kernel(op: Op, em) -> Callable | None:
    """The op table's kernel that skips the outputs nothing reads, or that keeps its output
    buffers between runs where the op runs at most once per run (float32, not checked)."""
    variants, buffered = DEAD_OUTPUT_KERNELS.get(op.opdef, {}), BUFFERED_KERNEL.get(op.opdef)
    if not (variants or buffered) or em.program.check_specs or not all_float32(op):
        return None
    facts = site_facts(op, em)
    dead, kernel = facts.dead, None
    if buffered is not None and facts.keeps and bounded(op):
        kernel = _per_replica(op, dead, buffered, em.program.namespace["RT"])
        em.program.stats["buffered_ops"] += kernel is not None
    kernel = kernel or variants.get(dead)
    if kernel is not None:
        em.program.stats["dead_outputs"] += len(dead)
    return kernel


def _per_replica(op: Op, dead: frozenset, buffered: Callable, runtime) -> Callable | None:
    """The buffered kernel; with several replicas in this process one per replica (each its
    own buffers: replicas run at once, in lock step or threads), picked by the replica the
    runtime is running."""
    n = len(runtime.local)
    kernels = [buffered(op, dead) for _ in range(n)]
    if kernels[0] is None or n == 1:
        return kernels[0]

    def by_replica(*args, **attrs):
        return kernels[runtime.slot](*args, **attrs)

    return by_replica


def graphs_run_once(ir, per_replica: bool = False) -> Set[Graph]:
    """The main graph, and graphs whose one call site in the whole Ir is a plain ``Call`` in
    a graph that runs once (not a loop body, not a branch, not called twice), when the run
    has one replica (replicas with collectives run at once, in threads); ``per_replica``:
    once per run of each replica, whatever the replication."""
    if ir.replication_factor != 1 and not per_replica:
        return set()
    sites: Dict[Graph, List[Op]] = {}
    for g in ir._graphs.values():
        for op in g._ops:
            for c in op.called_graphs:
                sites.setdefault(c, []).append(op)
    once = {ir.main_graph}
    changed = True
    while changed:  # call chains are short; a fixed point keeps it simple
        changed = False
        for g, ops in sites.items():
            if g in once or len(ops) != 1:
                continue
            if ops[0].opdef is CALL and ops[0].graph in once and g is not ir.main_graph:
                once.add(g)
                changed = True
    return once


def buffer_graphs(ir, once_per_replica: Set[Graph]) -> Set[Graph]:
    """The graphs whose ops may keep their output buffers between runs: those run once per
    run of each replica, unless the main graph loads from Streaming Memory. A phased program
    (weights staged in remote buffers, phase by phase) holds one phase's values at a time; a
    buffer kept per op would hold every phase's (the whole model's gradients, each RTS
    collective's result) for the Session's life, the memory phasing exists to save."""
    loads = (REMOTE_LOAD, REMOTE_LOAD_INPLACE)
    if any(op.opdef in loads for op in ir.main_graph._ops):
        return set()
    return set(once_per_replica)


# a kept buffer is memory held between steps that eager frees (its .grad is set to None):
# bound it, so that a model's largest layers (vgg's 411 MB classifier gradient) keep the
# allocate-and-free of eager; the seed MLP's 1-2 MB gradients, where the faults showed, and
# vit_b_16's up to 9.4 MB ones are kept
MAX_BUFFER_BYTES = 16 * 2**20


def bounded(op: Op) -> bool:
    """Every output small enough to keep a buffer of between runs (`MAX_BUFFER_BYTES`)."""
    return all(t.spec.nbytes <= MAX_BUFFER_BYTES for t in op.outputs)


def all_float32(op: Op) -> bool:
    """Every floating point operand is float32 (integer ones, e.g. pooling indices, pass)."""
    ts = (*op.inputs, *op.outputs)
    return all(t.dtype.as_torch() == torch.float32 for t in ts if not t.dtype.is_int)
