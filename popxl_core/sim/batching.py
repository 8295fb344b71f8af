"""Replica batching: how the simulator runs R data-parallel replicas faster than R runs.

Every replica runs the same main graph over its 1/R of the batch. Run as R programs one after
the other, a replication-4 step costs about four one-replica steps of small ops; the
mechanisms below make it cost about one (`benchmarks/RESULTS.md`, ``*_r4`` rows), each
keeping every replica's bits. They form one ladder, decided per program at Session build and
per run, with per-op-type rules in one table (`speed.REPLICA_BATCHING`: one
`speed.ReplicaBatching` per op, its ``fold`` and ``stack`` forms, and for a collective its
``reduce`` form) and one fallback everywhere: each replica's own call of the op's table
kernel, as the unbatched program makes it.

1. **Lock step** (`lockstep.py`, per program). A program with collectives runs its
   replicas as greenlets of one thread; at each collective the last to arrive computes
   every replica's result (`Runtime.collective`), in replica order as the threads'
   rendezvous does. Needs every replica in this process (`Runtime.spans_processes` is
   False); ``runtime.LOCKSTEP = False`` takes threads instead. No bit check: the same calls
   on the same values. A program without collectives runs its replicas one by one.
2. **Uniform work once** (`uniform.py`, per program, then per run). A static analysis of the
   main graph finds the work whose inputs are the same on every replica (the optimizer
   update after the all-reduces) and compiles a second main graph without it, which the
   followers run while the leader runs the whole graph on variable storage the replicas
   share. Needs the replicas in order in one process (lock step or one by one: the leader
   runs first). Bit check, every run until it holds: the shared variables are the same
   bits on every replica and the checked small streams the same bytes
   (`SharedRuns.prepare`); else the run is unshared (every replica its own main graph).
3. **Stacking** (`stacking.py`, per site). In lock step, an op whose rule has a ``stack``
   form (a GEMM of a weight of at least `stacking.MIN_SHARED_BYTES`) is a
   `batched_site.BatchedSite` whose rows are made per call (`RowsAt.CALL`): it waits at the
   hub, and where every replica waits at that op with the weight in the same memory, one
   kernel computes all of their outputs. Bit check per site and set of shapes (strides,
   alignment, threads): the stacked outputs against each replica's own kernel; else the
   fallback.
4. **Folding** (`fold.py`, per program, then per run and per site). Where the main graph
   qualifies (`fold.plan_fold`), the replicas' whole step is a third program, run once
   over their values concatenated along dim 0 (`fold.FoldRuntime`) by every run that
   shares (2). Per op of a called graph with a per-replica input, a `BatchedSite` whose
   rows are made for the step (`RowsAt.STEP`, `fold_site.fold_site`): its rule's ``fold``
   forms, tried in order at the site's first call and checked bit for bit against the
   fallback (per thread count); an ``exact`` form is emitted unchecked.
   The main graph's all-reduces become sums over the replica dim, each one's case decided
   once from the rules of the ops making their inputs (`fold.plan_reduces`,
   `fold_reduce.ReduceBy`): passed on from an op whose ``reduced`` form all-reduces its
   output (SITE), one call for a run of small ones in kept buffers (GROUP, `fold_group.py`;
   parameter gradients computed at the group, `fold_together.py`), else alone; each
   checked against the all-reduce's own reduction at its first run.

`ReplicaRuns` holds the per-program part (made with the Session: the follower program is
the compiled program's `uniform.Sharing`, the folded program is made here) and decides
each run's `runtime.ReplicaSchedule`: FOLDED where the run shares and folding applies,
else ONE_BY_ONE, LOCK_STEP or THREADS, with sharing and stacking where those allow. No
mechanism switches another off: each applies where its runtime allows, and the folded
program's runtime runs one run for all replicas, so it has no follower program and no hub.
``CompileOptions(share_uniform=, stack_replicas=, fold_replicas=)`` switch each off;
tests compare every setting with the others, bit for bit.

Stacking and folding are two ways one op's R replica calls become one call, at one site
class (`batched_site.BatchedSite`) whose `RowsAt` says when the rows are made; what each
decides, and where:

=================  ===============================  ==============================================
                   stacking (3)                     folding (4)
=================  ===============================  ==============================================
per program        `_stacks`: an unfolded program   `_folds`: the program shares its uniform work,
                   with 2+ replicas in this         every replica runs here; then `fold.plan_fold`:
                   process (no spec checks, no      every variable shared, the main graph's ops
                   inductor: `_batched`, both)      loads, stores, full all-reduces, uniform pure
                                                    ops and one-site calls of plain-kernel graphs
per run            the schedule is LOCK_STEP (the   the schedule is FOLDED (the run shares, no
                   hub exists)                      count depends on the data)
per site, at       rule's ``stack`` and ``fold``    every op of a folded graph with a per-replica
compile time       forms; float32; an output read;  input: ``exact`` (inline, unchecked), else a
                   shared inputs of at least        `RowsAt.STEP` site (its forms where the op
                   `stacking.MIN_SHARED_BYTES`:     is float32 without dtype wrappers and
                   a `RowsAt.CALL` site
                                                    ``rows`` holds, else the fallback alone)
per site, at run   every call: all replicas at the  first call: the forms against the fallback;
time               op, shared inputs one memory,    then the chosen callable is bound in place of
                   the others one shape; checked    the site; checked again where the thread
                   once per shapes, strides,        count changes
                   alignment and threads
values             R tensors, concatenated per      one tensor of R*b rows (uniform: one tensor)
                   call into the fold form's rows
fallback           the replica's own kernel         each replica's own kernel on its rows,
                                                    outputs concatenated (`BatchedSite.each`)
emitted code       ``outs = k(ins)``, ``k`` the     ``outs = fold(ins)``, ``fold`` the site, then
                   site: a greenlet switch to the   the chosen call (no per-call cost); an
                   hub per call                     ``exact`` op as the op's own code
=================  ===============================  ==============================================

What they share: one site class, the op's one rule row, one analysis of the site
(`variants.site_facts`: float32 operands without dtype wrappers, outputs nothing reads,
whether the graph may keep output buffers; kernel variants read it too), one bit check
(`BatchedSite.check`, `bits.Checked`: the forms tried by `bits.first_match`, the outcome
remembered per key; a form that raises is passed over), and the fallback's meaning (each
replica's own call of the table kernel). Folding alone batches the main graph's
all-reduces (sums over the replica dim, `fold_reduce.py`, `fold_group.py`,
`fold_together.py`): stacking leaves collectives to the lock-step hub.

`emit_batched` is the per-site half: the compiler asks it about every op it emits, and it
alone decides which of the two (if either) makes the op's site.

One form per op: the hub stacks with the op's ``fold`` forms (`BatchedSite.stacked`: the
replicas' unshared inputs concatenated along dim 0, as a folded program holds them;
`BatchedSite.split`: each replica given its part of every output); an op's ``stack`` rule
says only which inputs must be one memory on every replica (`forms.ReplicaStack.shared`).
What differs is a field of the site, `RowsAt`: the rows made once for the whole step
(folding), or per call at the hub (stacking).

What the compiled program and this machinery need of a runtime is `ReplicaRuntime`, which
`runtime.Runtime` (per replica) and `fold.FoldRuntime` (all replicas' rows at once) provide.
"""

from __future__ import annotations

import dataclasses
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Dict,
    List,
    Optional,
    Protocol,
    Sequence,
    runtime_checkable,
)

import numpy as np
import torch

from ..errors import OpDataError
from . import checks
from . import runtime as runtime_module
from .fold import FoldRuntime, plan_fold
from .fold_site import emit_exact, emit_folded_main, fold_site
from .runtime import ReplicaSchedule
from .stacking import stack_site
from .uniform import SharedRuns

if TYPE_CHECKING:  # pragma: no cover
    from ..graph import Op
    from .compile import Program
    from .runtime import Runtime

__all__ = [
    "ReplicaRuns",
    "ReplicaRuntime",
    "ReplicaSchedule",
    "emit_batched",
]


@runtime_checkable
class ReplicaRuntime(Protocol):
    """The runtime a compiled program's generated code calls as ``RT`` (host streams and
    collectives), and that the compiler's replica passes read (how many replicas, which run
    here, which replica is running)."""

    replicas: int
    local: Sequence[int]  # the replicas this process (or this folded run) runs

    @property
    def replica(self) -> int: ...

    @property
    def slot(self) -> int: ...

    @property
    def counts(self) -> Dict[object, int]: ...

    def start(
        self, inputs: Dict[object, np.ndarray], outputs: Dict[object, np.ndarray]
    ) -> None: ...

    def load(self, stream) -> torch.Tensor: ...

    def skip(self, stream) -> None: ...

    def store(self, stream, value: torch.Tensor) -> None: ...

    def collective(self, value: torch.Tensor, fn: Callable, need: bool = True) -> torch.Tensor: ...


class ReplicaRuns:
    """A Session's replica batching: made once with its program (the follower program is
    the program's `uniform.Sharing`; the folded program is made here), then per run the
    schedule and whether the run shares its uniform work."""

    def __init__(self, ir, program, runtime: Runtime) -> None:
        self.runtime = runtime
        # collectives need every replica at once: lock step or threads
        self.collectives = any(op.opdef.collective for g in program.graphs_used() for op in g._ops)
        self.sharing = SharedRuns(getattr(program, "sharing", None))
        self.fold: Optional[Program] = _fold_program(ir, program)
        self.follow: Optional[Callable] = None  # this run's followers' main (None: unshared)

    def prepare(self, device, feeds, data_dependent: bool) -> ReplicaSchedule:
        """This run's schedule; shares the uniform work where the replicas run in order
        and agree (`SharedRuns.prepare`), and folds where it shares, unless a stream's
        count depends on the data (checked per replica)."""
        schedule = self._unfolded()
        in_order = schedule is not ReplicaSchedule.THREADS and not self.runtime.spans_processes
        self.follow = self.sharing.prepare(device, feeds, in_order)
        if self.follow is not None and self.fold is not None and not data_dependent:
            return ReplicaSchedule.FOLDED
        return schedule

    def _unfolded(self) -> ReplicaSchedule:
        spans = self.runtime.spans_processes
        if not self.collectives or (len(self.runtime.local) == 1 and not spans):
            return ReplicaSchedule.ONE_BY_ONE
        if runtime_module.LOCKSTEP and not spans:
            return ReplicaSchedule.LOCK_STEP
        return ReplicaSchedule.THREADS

    def run_folded(self, device: Dict[int, List[Any]], feeds, outputs) -> None:
        """Every replica's run of the main graph as one run over their rows (fold.py), on
        the first local replica's variables (the shared ones: a folded run shares)."""
        fold = self.fold
        assert fold is not None  # `prepare` folds only with a folded program
        fold.namespace["RT"].start(feeds, outputs)
        try:
            fold.main.fn(device[self.runtime.local[0]])
        except (OpDataError, IndexError) as e:
            raise checks.with_op_context(fold, e) from None

    def main_of(self, replica: int) -> Optional[Callable]:
        """The followers' main function for ``replica`` in this run (None: the program's
        own): the first local replica runs the uniform work for all."""
        if self.follow is not None and replica != self.runtime.local[0]:
            return self.follow
        return None

    def unshare(self, device: Optional[Dict[int, List[Any]]]) -> None:
        """Every replica its own copy of the variables again (before a host write)."""
        self.sharing.unshare(device)

    def adopt(self, device: Dict[int, List[Any]], i: int, tensor: torch.Tensor) -> bool:
        """``tensor`` as every replica's value of variable ``i`` where they share it now
        (`uniform.SharedRuns.adopt`); False: the caller copies it to each replica."""
        return self.sharing.adopt(device, i, tensor)


def _fold_program(ir, program) -> Optional[Program]:
    """The folded program of a replicated ``program`` (fold.py), compiled as ``program``
    is, or None (the reference interpreter's program has no uniform sharing to fold on)."""
    plan = plan_fold(program) if _folds(program) else None
    if plan is None:
        return None
    return type(program)(ir, FoldRuntime(plan), folded_options(program.options), fold=plan)


def emit_batched(op: Op, plan, em, emit_kernel: Callable, bound_kernel: Callable) -> bool:
    """The per-site half of replica batching, asked by the compiler for every op it emits
    (after foreach groups and handoff calls): emit ``op`` as its batched site (True), or
    leave it to the compiler (False). In a folded program every op of a folded graph is
    folded (`_emit_folded`) and the main graph's all-reduces batched
    (`fold_site.emit_folded_main`); in another, an op may be stacked (`_emit_stacked`).
    ``emit_kernel``, ``bound_kernel``: the compiler's default emission and its table
    kernel with its dtype wrappers (the fallback's kernel)."""
    fold = em.program.fold
    if fold is not None and em.graph in fold.graphs:
        _emit_folded(op, em, emit_kernel, bound_kernel)
        return True
    if fold is not None:
        return emit_folded_main(op, plan, em, emit_kernel)
    return _emit_stacked(op, plan, em, bound_kernel)


def _emit_folded(op: Op, em, emit_kernel: Callable, bound_kernel: Callable) -> None:
    """An op of a folded graph: with uniform inputs it runs once, as on one replica; with a
    per-replica input its rule's ``exact`` fold is its own code with folded attributes,
    else a `RowsAt.STEP` site (`fold_site.fold_site`) checks its forms against the
    fallback (none: the fallback)."""
    program = em.program
    fold = program.fold
    if not any(t in fold.stacked for t in op.inputs):
        (op.opdef.emit or emit_kernel)(op, em)
    elif not emit_exact(op, em, fold, emit_kernel):
        site = fold_site(op, em, fold, bound_kernel)
        program.stats["folded_ops"] += bool(site.checked.forms)
        site.name, site.namespace = em.emit_call("fold", site, op), program.namespace
        fold.sites.append(site)


def _emit_stacked(op: Op, plan, em, bound_kernel: Callable) -> bool:
    """An op of an unfolded program whose replicas may stack (`_stacks`), that no pass
    rewrote, as a `RowsAt.CALL` site (`stacking.stack_site`) where its rule's ``stack``
    form and its use allow (taken before `speed.DIRECT`'s torch call: no op has both)."""
    if not _stacks(em.program) or op.opdef.emit is not None:
        return False
    if op in plan.fused or op in plan.pairs or op in plan.reuse:
        return False
    site = stack_site(op, em, bound_kernel)
    if site is None:
        return False
    em.program.stats["stacked_ops"] += 1
    em.emit_call("k", site, op)
    return True


# which forms a program's sites may take: the per-program half of the decision
def _batched(program) -> bool:
    """Neither form where the program checks each kernel's output specs (a batched call is
    not the op's own) or runs under inductor (its compiled graphs replace the kernels)."""
    return not program.options.inductor and not program.check_specs


def _folds(program) -> bool:
    """Folding may apply (`fold.plan_fold` then asks the graphs): the program shares its
    uniform work and its runtime runs every replica, in this process."""
    if getattr(program, "sharing", None) is None or not program.options.fold_replicas:
        return False  # (the reference interpreter's program shares nothing)
    runtime = program.namespace["RT"]
    every = len(runtime.local) == program.ir.replication_factor and not runtime.spans_processes
    return every and _batched(program)


def _stacks(program) -> bool:
    """Stacking may apply: the runtime runs several replicas here (in lock step where the
    schedule is LOCK_STEP; elsewhere the sites are not met and each replica computes its
    own)."""
    runtime = program.namespace["RT"]
    return program.options.stack_replicas and len(runtime.local) >= 2 and _batched(program)


def folded_options(options):
    """The options a folded program compiles with. Its graphs' ops are emitted one by one
    (`fold_site`), so no pairs fused across them (``transposed_matmuls``, ``conv_pairs``);
    its frees are not deferred to the next run (``defer_release``: `Session._run` empties
    the unfolded program's deferred list only). Sharing and stacking need no switch: they
    apply where the runtime runs several replicas, and `fold.FoldRuntime` runs one."""
    return dataclasses.replace(
        options, transposed_matmuls=False, conv_pairs=False, defer_release=False
    )
