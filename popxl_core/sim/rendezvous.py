"""The barrier where replicas running in threads meet at a collective.

Unlike `threading.Barrier`, it knows when a replica has finished its program: a replica
waiting at a collective then can never be matched (the replicas ran different collectives,
e.g. an If took different branches), and it raises instead of hanging.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Optional, Protocol

__all__ = ["Barrier", "Rendezvous", "ReplicaMismatchError"]


class Barrier(Protocol):
    """Where a run's replicas meet at each collective (`Runtime.meeting`): a `Rendezvous`
    of threads, or lock step's hub (`lockstep.py`)."""

    # the last replica to arrive computes every replica's result while the others wait,
    # their values untouched (greenlets); else each replica snapshots its value (threads)
    lockstep: bool
    stacks: bool  # `RowsAt.CALL` sites (stacking.py) wait here too, answered by ``hub``
    hub: Any  # the greenlet a waiting replica switches to (None: threads)

    def wait(self, action: Optional[Callable[[], None]] = None) -> None: ...


class ReplicaMismatchError(RuntimeError):
    """The replicas did not run the same collectives in the same order."""


class Rendezvous:
    """A reusable barrier for ``parties`` threads that fails instead of waiting forever."""

    lockstep = False  # threads: each replica snapshots its value (`Runtime.collective`)
    stacks = False  # no `RowsAt.CALL` site waits here: only lock step's hub answers those
    hub = None

    def __init__(self, parties: int) -> None:
        self.parties = parties
        self._cond = threading.Condition()
        self._arrived = 0
        self._generation = 0
        self._finished = 0
        self._broken = False

    def wait(self, action: Optional[Callable[[], None]] = None) -> None:
        """Wait for every party; the last to arrive first runs ``action`` (an exchange with
        other processes), while the others wait. An error there breaks the barrier."""
        with self._cond:
            self._check()
            generation = self._generation
            self._arrived += 1
            if self._arrived == self.parties:
                if action is not None:
                    try:
                        action()
                    except BaseException:
                        self._broken = True
                        self._cond.notify_all()
                        raise
                self._arrived = 0
                self._generation += 1
                self._cond.notify_all()
                return
            while generation == self._generation:
                self._check()
                self._cond.wait()

    def _check(self) -> None:
        if self._broken:
            raise threading.BrokenBarrierError
        if self._finished:
            self._broken = True
            self._cond.notify_all()
            raise ReplicaMismatchError(
                "A replica finished its program while another waits at a collective: the "
                "replicas ran different collectives (did an If take different branches?)."
            )

    def finish(self) -> None:
        """The calling replica has run its whole program."""
        with self._cond:
            self._finished += 1
            self._cond.notify_all()

    def abort(self) -> None:
        with self._cond:
            self._broken = True
            self._cond.notify_all()
