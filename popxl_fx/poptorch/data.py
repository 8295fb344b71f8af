"""``poptorch.DataLoader`` and ``AsynchronousDataAccessor``.

PopTorch's loader yields *combined* batches: ``batch_size x deviceIterations x
replicationFactor x gradientAccumulation`` samples per item (what one executor call takes).
All three modes (Sync, Async, AsyncRebatched) yield the same batches here; the asynchronous
ones are torch's worker processes, which the loader's iterator shuts down when it is
dropped or exhausted.
"""

from __future__ import annotations

from typing import Any

import torch

from .enums import DataLoaderMode
from .errors import Error
from .options import Options

__all__ = ["AsynchronousDataAccessor", "DataLoader"]


class DataLoader(torch.utils.data.DataLoader):
    """``poptorch.DataLoader(options, dataset, batch_size=1, shuffle=False, ...)``."""

    def __init__(
        self,
        options: Options,
        dataset,
        batch_size: int = 1,
        shuffle: bool = False,
        num_workers: int = 0,
        drop_last: bool = True,
        persistent_workers=None,
        auto_distributed_partitioning: bool = True,
        mode: DataLoaderMode = DataLoaderMode.Sync,
        async_options=None,
        rebatched_worker_size=None,
        **kwargs: Any,
    ) -> None:
        if not isinstance(options, Options):
            raise Error(
                f"poptorch.DataLoader's first argument is the poptorch.Options, not a "
                f"{type(options).__name__}."
            )
        if batch_size is None or batch_size < 1:
            raise ValueError(f"poptorch.DataLoader(batch_size={batch_size!r}): give 1 or more.")
        self._combined_batch_size = batch_size * _per_call(options)
        self._options = options
        self.poptorch_mode = DataLoaderMode(mode)
        if persistent_workers is None:
            persistent_workers = num_workers > 0
        if auto_distributed_partitioning:
            dataset = _process_share(dataset, options, self._combined_batch_size, drop_last)
        batching = dict(batch_size=self._combined_batch_size, shuffle=shuffle, drop_last=drop_last)
        if kwargs.get("batch_sampler") is not None:  # it makes the batches itself
            batching = {}
        super().__init__(
            dataset,
            num_workers=num_workers,
            persistent_workers=persistent_workers and num_workers > 0,
            **batching,
            **kwargs,
        )

    @property
    def combinedBatchSize(self) -> int:
        """Samples per item: batch_size x the options' device iterations, replicas and
        micro-batches."""
        return self._combined_batch_size

    @property
    def options(self) -> Options:
        return self._options

    def terminate(self) -> None:
        """Stop the worker processes now (they also stop when the loader is dropped)."""
        iterator = getattr(self, "_iterator", None)
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()
        self._iterator = None


def _process_share(dataset, options: Options, step: int, drop_last: bool):
    """This process's contiguous block of ``dataset`` when Distributed names several
    processes: whole combined batches each with ``drop_last``, else as even as possible."""
    procs, proc = options.Distributed.numProcesses, options.Distributed.processId
    if procs == 1:
        return dataset
    total = len(dataset)
    if drop_last:
        per_proc = step * (total // (step * procs))
        start, length = proc * per_proc, per_proc
    else:
        sizes = [total // procs + (total % procs > p) for p in range(procs)]
        start, length = sum(sizes[:proc]), sizes[proc]
    return torch.utils.data.Subset(dataset, range(start, min(start + length, total)))


def _per_call(options: Options) -> int:
    return (
        options.device_iterations
        * options.replication_factor
        * options.Training.gradient_accumulation
    )


class AsynchronousDataAccessor:
    """``poptorch.AsynchronousDataAccessor(dataset)``: iterates the loader it wraps."""

    def __init__(
        self,
        dataset,
        buffer_size: int = 3,
        miss_sleep_time_in_ms: float = 0.1,
        load_indefinitely: bool = True,
        early_preload: bool = False,
        sharing_strategy=None,
        rebatched_size=None,
    ) -> None:
        self._data = dataset
        self.combinedBatchSize = getattr(dataset, "combinedBatchSize", None)

    def __len__(self) -> int:
        return len(self._data)

    def __iter__(self):
        return iter(self._data)

    def terminate(self) -> None:
        terminate = getattr(self._data, "terminate", None)
        if callable(terminate):
            terminate()

    def __del__(self) -> None:
        self.terminate()
