"""The process behind `poptorch.AsynchronousDataAccessor`: it iterates the data set and fills
the shared ring (`_data_ring.Ring`) ahead of the host.

It takes the first element at once (its shapes size the ring; it fills the first slot), then
loads when the host says START, or at once with ``early_preload``. At the end of a pass it
writes an END slot and, with ``load_indefinitely``, goes on with the next pass; otherwise it
waits for the next START. RESET (the host restarts a pass part-way) empties the ring and
starts the data set again; SHUTDOWN (or the host going away) ends the process.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle

import torch

from ._data_ring import END, FULL, Ring, leaves, template_of
from ._logging import logger
from .errors import Error

__all__ = ["RESET", "SHUTDOWN", "START", "main"]

START, RESET, SHUTDOWN = "start", "reset", "shutdown"
_MAX_WAIT_S = 0.005  # a full ring backs off to this between checks


class _Interrupted(Exception):
    """The host reset the pass or asked to shut down while the worker waited for a slot."""


def main(conn, payload, hook: bool, settings: dict) -> None:
    """The worker process's entry point."""
    logger.debug("AsynchronousDataAccessor worker process: %d", os.getpid())
    try:
        _Worker(conn, _load(payload, hook), **settings).run()
    except KeyboardInterrupt:
        pass  # the user interrupted the program: leave without a traceback


def _load(payload, hook: bool):
    if hook:  # the data set's classes may `import poptorch`, as in the host
        from popxl_fx import compat

        compat.install()
        # torch's workers, started from here, would otherwise start as this process did
        # (spawn / forkserver: without the hook); forked, they keep it
        multiprocessing.set_start_method("fork", force=True)
    if isinstance(payload, str):  # SharingStrategy.FileSystem: a pickle file
        with open(payload, "rb") as f:
            return pickle.load(f)
    return pickle.loads(payload)


class _Worker:
    def __init__(
        self, conn, dataset, slots, miss_sleep_s, load_indefinitely, early_preload, rebatch
    ) -> None:
        self.conn, self.dataset, self.slots = conn, dataset, slots
        self.miss_sleep_s, self.load_indefinitely = miss_sleep_s, load_indefinitely
        self.loading, self.rebatch = early_preload, rebatch
        # PopTorch's DataLoader says whether a rebatched remainder is dropped
        self.drop_last = getattr(dataset, "rebatched_drop_last", True)
        self.stop, self.slot = False, 0
        self.pending: list = []

    def run(self) -> None:
        self.iterator = iter(self.dataset)
        first = next(self.iterator, None)
        if first is None:
            raise Error("The Dataset is empty")
        tensors = leaves(first)
        self.ring = Ring.allocate(self.slots, tensors, self.rebatch)
        self.conn.send((template_of(first), self.ring.parts()))
        self._guarded(self._offer, tensors)
        while not self.stop:
            self._serve()
            if self.loading and not self.stop:
                self._guarded(self._step)

    def _guarded(self, step, *args) -> None:
        try:
            step(*args)
        except _Interrupted:
            pass

    # the host's commands ------------------------------------------------------------------
    def _serve(self) -> None:
        """Handle waiting commands; while not loading, wait for one."""
        while not self.stop and (not self.loading or self.conn.poll()):
            self._handle(self._receive())

    def _receive(self) -> str:
        try:
            return self.conn.recv()
        except (EOFError, OSError):  # the host is gone
            return SHUTDOWN

    def _handle(self, command: str) -> None:
        if command == START:
            self.loading = True
        elif command == RESET:
            self._reset()
        else:
            self.stop = True

    def _reset(self) -> None:
        self.iterator = iter(self.dataset)
        self.pending, self.slot, self.loading = [], 0, False
        self.ring.ready.fill_(False)
        self.conn.send(RESET)  # the host waits for this before it reads again

    # loading ------------------------------------------------------------------------------
    def _step(self) -> None:
        try:
            element = next(self.iterator)
        except StopIteration:
            self._end_of_pass()
            return
        self._offer(leaves(element))

    def _offer(self, tensors: list[torch.Tensor]) -> None:
        if self.rebatch is None:
            self._publish(tensors)
            return
        self.pending.append(tensors)
        while sum(len(p[0]) for p in self.pending) >= self.rebatch:
            joined = [torch.cat(parts) for parts in zip(*self.pending)]
            self.pending = [[t[self.rebatch :] for t in joined]]
            self._publish([t[: self.rebatch] for t in joined])
        self.pending = [p for p in self.pending if len(p[0])]

    def _end_of_pass(self) -> None:
        if self.pending and not self.drop_last:
            joined = [torch.cat(parts) for parts in zip(*self.pending)]
            self._publish(joined, len(joined[0]))
        self.pending = []
        self.ring.mark(self._free_slot(), END)
        self.slot = (self.slot + 1) % self.slots
        self.iterator = iter(self.dataset)
        self.loading = self.load_indefinitely

    def _publish(self, tensors: list[torch.Tensor], rows: int = FULL) -> None:
        self.ring.write(self._free_slot(), tensors, rows)
        self.slot = (self.slot + 1) % self.slots

    def _free_slot(self) -> int:
        """The next slot once the host has read it, handling commands meanwhile."""
        wait = self.miss_sleep_s
        while bool(self.ring.ready[self.slot]):
            if self.conn.poll(wait):
                command = self._receive()
                self._handle(command)
                if command != START:
                    raise _Interrupted
            wait = min(2 * wait, _MAX_WAIT_S)
        return self.slot
