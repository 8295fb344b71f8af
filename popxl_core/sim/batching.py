"""Replica batching: how the simulator runs R data-parallel replicas faster than R runs.

Every replica runs the same main graph over its 1/R of the batch. Run as R programs one after
the other, a replication-4 step costs about four one-replica steps of small ops; the
mechanisms below make it cost about one (`benchmarks/RESULTS.md`, ``*_r4`` rows), each
keeping every replica's bits. They form one ladder, decided per program at Session build and
per run, with per-op-type rules in one table (`speed.REPLICA_BATCHING`: one
`speed.ReplicaBatching` per op, its ``fold`` and ``stack`` forms) and one fallback
everywhere: each replica's own call of the op's table kernel, as the unbatched program
makes it.

1. **Lock step** (`lockstep.py`, per run). A program with collectives runs its replicas as
   greenlets of one thread; at each collective the last to arrive computes every replica's
   result (`Runtime.collective`), in replica order as the threads' rendezvous does. Decided
   by `runtime.run_replicas`: collectives, and every replica in this process
   (`Runtime.spans_processes` is False); ``runtime.LOCKSTEP = False`` takes threads instead.
   No bit check: the same calls on the same values.
2. **Uniform work once** (`uniform.py`, per program, then per run). A static analysis of the
   main graph finds the work whose inputs are the same on every replica (the optimizer
   update after the all-reduces) and compiles a second main graph without it, which the
   followers run while the leader runs the whole graph on variable storage the replicas
   share. Bit check, every run until it holds: the shared variables are the same bits on
   every replica and the checked small streams the same bytes (`SharedRuns.prepare`);
   else the run is unshared (every replica its own main graph).
3. **Stacking** (`stacking.py`, per site). In lock step, an op whose rule has a ``stack``
   form (a GEMM of a weight of at least `stacking.MIN_SHARED_BYTES`) waits at the hub;
   where every replica waits at that op with the weight in the same memory, one kernel
   computes all of their outputs. Bit check per site and set of shapes (strides,
   alignment, threads): the stacked outputs against each replica's own kernel; else the
   fallback.
4. **Folding** (`fold.py`, per program, then per site). Where a run shares its uniform work
   and the main graph qualifies (`fold.plan_fold`), the replicas' whole step is a third
   program run once over their values concatenated along dim 0 (`fold.FoldRuntime`). Per
   op of a called graph with a per-replica input (`fold_site.FoldSite`): its
   rule's ``fold`` forms, tried in order at the site's first call and checked bit for
   bit against the fallback (per thread count); an ``exact`` form is emitted unchecked. The main
   graph's all-reduces become sums over the replica dim (`fold_reduce.py`, groups of small
   ones in kept buffers: `fold_group.py`; parameter gradients computed at the group:
   `fold_together.py`), each checked against the all-reduce's own reduction at its first run.

Which switches which off: folding needs a shared run (2) in lock step (1) and replaces the
follower program and stacking for the runs it takes (`fold_options`: the folded program is
compiled without them); stacking needs lock step's hub; sharing needs lock step. A run that
folds is chosen per run by `Session._run` (a shared run, no data-dependent stream counts);
every other run takes the lock-step or threaded path with sharing and stacking where they
apply. ``CompileOptions(share_uniform=, stack_replicas=, fold_replicas=)`` switch each off;
tests compare every setting with the others, bit for bit.

What the compiled program and this machinery need of a runtime is `ReplicaRuntime`, which
`runtime.Runtime` (per replica) and `fold.FoldRuntime` (all replicas' rows at once) provide.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Dict, Optional, Protocol, Sequence, runtime_checkable

import numpy as np
import torch

from .speed import REPLICA_BATCHING

if TYPE_CHECKING:  # pragma: no cover
    from ..ops.forms import ReplicaFold, ReplicaStack

__all__ = ["ReplicaRuntime", "fold_rule", "known_fold", "stack_rule"]


def fold_rule(opdef) -> Optional[ReplicaFold]:
    """How replicas' calls of ``opdef`` fold into one over their rows (None: they do not)."""
    rule = REPLICA_BATCHING.get(opdef)
    return None if rule is None else rule.fold


def known_fold(opdef) -> ReplicaFold:
    """`fold_rule` of an op known to have one (a planned fold site's)."""
    rule = fold_rule(opdef)
    if rule is None:
        raise KeyError(f"{opdef.name} has no fold form in speed.REPLICA_BATCHING")
    return rule


def stack_rule(opdef) -> Optional[ReplicaStack]:
    """How replicas' calls of ``opdef`` stack at lock step's hub (None: they do not)."""
    rule = REPLICA_BATCHING.get(opdef)
    return None if rule is None else rule.stack


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
