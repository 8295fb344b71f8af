"""``poptorch.AsynchronousDataAccessor``: a worker process loads the data set ahead of the
host into a ring of shared-memory buffers (`_data_ring`, `_data_worker`).

The elements it returns are views of that shared memory, as PopTorch's are: the slot is
refilled once the next element is asked for. The process stops with `terminate()`, when the
accessor is collected, or when the program exits.
"""

from __future__ import annotations

import atexit
import os
import pickle
import signal
import sys
import tempfile
import time
import weakref
from typing import Any

import torch.multiprocessing as multiprocessing

from . import _data_worker
from ._data_ring import END, Ring, rebuild
from .enums import SharingStrategy
from .errors import Error

__all__ = ["AsynchronousDataAccessor"]

_START_METHOD = {
    SharingStrategy.SharedMemory: "spawn",
    SharingStrategy.FileSystem: "spawn",
    SharingStrategy.Fork: "fork",
    SharingStrategy.ForkServer: "forkserver",
}
_LIVE: weakref.WeakSet = weakref.WeakSet()  # handles to stop at exit (weak: GC stops the rest)


class AsynchronousDataAccessor:
    """``poptorch.AsynchronousDataAccessor(dataset, buffer_size=3, ...)``."""

    def __init__(
        self,
        dataset,
        buffer_size: int = 3,
        miss_sleep_time_in_ms: float = 0.1,
        load_indefinitely: bool = True,
        early_preload: bool = False,
        sharing_strategy: SharingStrategy = SharingStrategy.ForkServer,
        rebatched_size: int | None = None,
    ) -> None:
        self._worker = None  # terminate() may run if the checks below fail
        _check(dataset, rebatched_size)
        self._dataset, self.rebatched_size = dataset, rebatched_size
        settings = dict(
            slots=buffer_size,
            miss_sleep_s=miss_sleep_time_in_ms / 1000.0,
            load_indefinitely=load_indefinitely,
            early_preload=early_preload,
            rebatch=rebatched_size,
        )
        self._worker = _WorkerHandle(dataset, settings, SharingStrategy(sharing_strategy))

    def terminate(self) -> None:
        """Stop the worker process now."""
        if self._worker is not None:
            self._worker.terminate()
            self._worker = None

    def __del__(self) -> None:
        self.terminate()

    def __len__(self) -> int:
        length = len(self._dataset)
        # a poptorch.DataLoader that owns this accessor has counted the rebatching already
        if self.rebatched_size and getattr(self._dataset, "_accessor", None) is not self:
            length = length * self._dataset.batch_size // self.rebatched_size
        return length

    def __iter__(self) -> AsynchronousDataAccessor:
        assert self._worker is not None, "terminated"  # terminate() drops the worker
        self._worker.restart()
        return self

    def __next__(self) -> Any:
        assert self._worker is not None, "terminated"
        element = self._worker.next_element()
        if element is END:
            raise StopIteration
        return element


def _check(dataset, rebatched_size: int | None) -> None:
    # a poptorch.DataLoader is known by its combinedBatchSize (data.py imports this module)
    is_loader = hasattr(type(dataset), "combinedBatchSize")
    if is_loader and dataset._accessor is not None:
        raise Error(
            "The DataLoader already uses an AsynchronousDataAccessor internally. Either use "
            "the existing one or set mode='poptorch.DataLoaderMode.Sync' in the DataLoader."
        )
    if rebatched_size is not None and rebatched_size <= 1:
        raise AssertionError("rebatched_size must be None or greater than 1")
    if is_loader and rebatched_size is None:
        # a worker's partial last batch has nowhere to go without rebatching
        if not dataset._user_batch_sampler and not dataset.drop_last:
            if dataset.combinedBatchSize not in (None, 1):
                raise AssertionError(
                    "The 'drop_last=False' option from the DataLoader only works if "
                    "'rebatched_size' is specified too."
                )


class _WorkerHandle:
    """The host's end of one worker process (PopTorch's ``AsynchronousWorker``)."""

    def __init__(self, dataset, settings: dict, strategy: SharingStrategy) -> None:
        ctx = multiprocessing.get_context(_START_METHOD[strategy])
        if _START_METHOD[strategy] == "forkserver":
            ctx.set_forkserver_preload([_data_worker.__name__])  # import torch once, there
        self._conn, child = ctx.Pipe()
        payload, self._file = _payload(dataset, strategy)
        hook = "poptorch" in sys.modules  # the data set's module may `import poptorch`
        args = (child, payload, hook, settings)
        self._process = ctx.Process(target=_data_worker.main, args=args)
        self._process.start()
        child.close()
        self._started = self._used = self._at_end = False
        self._slot = 0
        self._locked: int | None = None
        _LIVE.add(self)
        self._setup()

    def _setup(self) -> None:
        try:
            template, parts = self._conn.recv()
        except (EOFError, OSError):
            self.terminate()
            raise Error(
                "AsynchronousDataAccessor worker thread failed to start (Check above for details)"
            ) from None
        self._template, self._data_buffers = template, Ring(*parts)

    # iterating ----------------------------------------------------------------------------
    def restart(self) -> None:
        """Start a pass: go on where the worker is, or make it start again part-way."""
        if self._started and self._used and not self._at_end:
            self._reset()
        if not (self._started and not self._used):
            self._conn.send(_data_worker.START)
        self._started, self._used, self._at_end = True, False, False

    def _reset(self) -> None:
        self._release()
        self._conn.send(_data_worker.RESET)
        while not self._conn.poll(0.05):
            self._check_alive()
        self._conn.recv()
        self._slot = 0

    def next_element(self) -> Any:
        """The next element of this pass, or END (again, until the next pass starts)."""
        if not self._started:  # next() without iter(): the worker waits for a START
            self.restart()
        if self._at_end:
            return END
        self._release()
        ring, slot = self._data_buffers, self._slot
        self._wait_ready(slot)
        self._slot, self._used = (slot + 1) % ring.slots, True
        if int(ring.rows[slot]) == END:
            ring.ready[slot] = False
            self._at_end = True
            return END
        self._locked = slot
        return rebuild(self._template, iter(ring.read(slot)))

    def _wait_ready(self, slot: int) -> None:
        ready, wait = self._data_buffers.ready, 1e-5
        while not bool(ready[slot]):
            self._check_alive()
            time.sleep(wait)
            wait = min(2 * wait, 1e-3)

    def _release(self) -> None:
        if self._locked is not None:
            self._data_buffers.ready[self._locked] = False
            self._locked = None

    def _check_alive(self) -> None:
        if self._process.exitcode is not None:
            raise Error(
                f"An error occurred in the data fetcher: the AsynchronousDataAccessor worker "
                f"process exited with code {self._process.exitcode} (check above for details)."
            )

    # stopping -----------------------------------------------------------------------------
    def terminate(self) -> None:
        if self._process.exitcode is None:
            try:
                self._conn.send(_data_worker.SHUTDOWN)
            except (BrokenPipeError, OSError):
                pass
            _join(self._process)
        self._conn.close()
        if self._file is not None:
            self._file.cleanup()
            self._file = None
        _LIVE.discard(self)


def _join(process) -> None:
    """Wait for the process; interrupt it, then kill it, if it does not stop."""
    process.join(timeout=10)
    if process.exitcode is None:  # busy in the data set: interrupt it
        os.kill(process.pid, signal.SIGINT)
        process.join(timeout=10)
    if process.exitcode is None:
        process.terminate()
        process.join()


def _payload(dataset, strategy: SharingStrategy) -> tuple:
    """The pickled data set (bytes, or a file for FileSystem) and the folder to remove."""
    if strategy != SharingStrategy.FileSystem:
        return pickle.dumps(dataset), None
    folder = tempfile.TemporaryDirectory(prefix="poptorch_dataset_")
    path = os.path.join(folder.name, "dataset.pkl")
    with open(path, "wb") as f:
        pickle.dump(dataset, f, protocol=4)
    return path, folder


@atexit.register
def _stop_all() -> None:
    # runs before multiprocessing's own exit handler, which would wait for the workers
    for handle in list(_LIVE):
        handle.terminate()
