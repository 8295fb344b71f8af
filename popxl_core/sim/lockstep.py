"""Replicas with collectives run as greenlets in the calling thread, in lock step.

Each replica's program runs in its own greenlet; at a collective it leaves its value in the
runtime's slots and switches back to the hub, which resumes the replicas one after the other
once every replica has arrived (the IPU's BSP sync). Unlike one OS thread per replica, a
collective costs a few greenlet switches (microseconds) and no wait for the scheduler to give
each thread a core: with threads, a replication-4 step of the seed MLP took 6x the one-replica
step over the same global batch on a loaded 2-core machine, most of it threads waiting for a
core at each of its collectives.

A replica may also wait at a `batched_site.BatchedSite` whose rows are made per call
(`RowsAt.CALL`: an op the replicas may compute as one kernel; stacking.py): the hub
answers those waits before it goes on, with every replica's share of one stacked call
where all of them wait at the same op, else with None (each computes its own).

A replica that finishes while another waits at a collective means the replicas ran different
collectives: `ReplicaMismatchError`, as with `Rendezvous`. An error in a replica is raised
in the caller; the other replicas' greenlets are thrown away.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, List, Optional

import greenlet

from .batched_site import StackRequest
from .bits import as_tuple
from .rendezvous import ReplicaMismatchError
from .stacking import stacked_values

if TYPE_CHECKING:  # pragma: no cover
    from .runtime import Runtime

__all__ = ["run_lockstep"]


class _HubBarrier:
    """`Runtime.collective`'s barrier: the calling replica's greenlet yields to the hub."""

    lockstep = True
    stacks = True  # `RowsAt.CALL` sites wait here too (stacking.py)

    def __init__(self, hub: greenlet.greenlet) -> None:
        self.hub = hub

    def wait(self, action: Optional[Callable[[], None]] = None) -> None:
        assert action is None  # every replica is in this process: none exchanges
        self.hub.switch()


def run_lockstep(runtime: Runtime, body: Callable[[int], None]) -> None:
    """``body(replica)`` for every replica of ``runtime`` (one process runs them all),
    meeting at each collective."""
    n = runtime.replicas
    states = [runtime.replica_state(r) for r in range(n)]
    lets = [greenlet.greenlet(lambda r=r: body(r)) for r in range(n)]
    with runtime.meeting(_HubBarrier(greenlet.getcurrent())):
        while not all(g.dead for g in lets):
            waits: List[object] = [None] * n
            for r, g in enumerate(lets):
                if not g.dead:
                    runtime.run_as(states[r])  # the replica's stream counters and parity
                    waits[r] = g.switch()  # runs until it waits or ends (errors propagate)
            _answer_stacks(runtime, lets, states, waits)
            _check_met(lets)


def _answer_stacks(runtime: Runtime, lets, states, waits: List[object]) -> None:
    """Resume the replicas waiting at stack sites, in replica order, until every replica
    waits at a collective or has finished."""

    def own(r: int, request: StackRequest):
        runtime.run_as(states[r])  # a replica's own kernel may keep per-replica buffers
        return as_tuple(request.site.own(*request.args))

    while any(isinstance(w, StackRequest) for w in waits):
        values = stacked_values(waits, own)
        for r, w in enumerate(waits):
            if isinstance(w, StackRequest):
                runtime.run_as(states[r])
                waits[r] = lets[r].switch(None if values is None else values[r])


def _check_met(lets: List[greenlet.greenlet]) -> None:
    """After a round every replica waits at the same barrier or every one has finished."""
    done = [g.dead for g in lets]
    if any(done) and not all(done):
        waiting = ", ".join(str(r) for r, d in enumerate(done) if not d)
        raise ReplicaMismatchError(
            f"A replica finished its program while replicas {waiting} wait at a collective: "
            "the replicas ran different collectives (did an If take different branches?)."
        )
