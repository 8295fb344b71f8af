"""``poptorch.DataLoader``: torch's DataLoader yielding PopTorch's *combined* batches.

Each item holds ``batch_size x deviceIterations x (replicationFactor / input group size) x
gradientAccumulation`` samples: what one executor call takes. ``DataLoaderMode.Async`` loads
through an `AsynchronousDataAccessor` (a worker process ahead of the host);
``AsyncRebatched`` (and Async with ``drop_last=False``) lets the workers load smaller batches
that the accessor joins into combined ones. With several ``Distributed`` processes each takes
its own block of the data set (`_ProcessShare`), shuffled alike in every process.
"""

from __future__ import annotations

from typing import Any

import torch

from . import _data_ring
from ._logging import logger
from .accessor import AsynchronousDataAccessor
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
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        num_workers: int = 0,
        drop_last: bool = True,
        persistent_workers: bool | None = None,
        auto_distributed_partitioning: bool = True,
        mode: DataLoaderMode = DataLoaderMode.Sync,
        async_options: dict | None = None,
        rebatched_worker_size: int | None = None,
        batch_sampler=None,
        **kwargs: Any,
    ) -> None:
        _check_options(options)
        self._accessor, self._options = None, options
        batch_size, drop_last = self._take_sampler(
            options, batch_size, shuffle, drop_last, batch_sampler, auto_distributed_partitioning
        )
        options._freeze()
        self._set_sizes(options, batch_size)
        dataset, shuffle = self._partition(
            dataset, options, shuffle, num_workers, auto_distributed_partitioning, kwargs
        )
        mode, rebatched, load_batch = self._rebatching(mode, rebatched_worker_size)
        if rebatched is not None:  # the accessor drops (or keeps) the remainder, not torch
            self.rebatched_drop_last, drop_last = drop_last, False
        super().__init__(
            dataset,
            batch_size=load_batch,
            shuffle=bool(shuffle),
            batch_sampler=batch_sampler,
            num_workers=num_workers,
            drop_last=drop_last,
            persistent_workers=_persistent(persistent_workers, num_workers),
            **kwargs,
        )
        self._accessor = self._async_accessor(mode, async_options, rebatched)

    def _async_accessor(self, mode, async_options, rebatched) -> AsynchronousDataAccessor | None:
        if mode != DataLoaderMode.Async:
            return None
        return AsynchronousDataAccessor(
            self, **_async_options(async_options), rebatched_size=rebatched
        )

    def _take_sampler(self, options, batch_size, shuffle, drop_last, sampler, partition) -> tuple:
        """(batch size, drop_last for torch): a batch sampler makes the batches itself, and
        ``drop_last`` then drops a last group of fewer batches than a call takes."""
        self._user_batch_sampler = sampler is not None
        self._real_drop_last = drop_last
        if not self._user_batch_sampler:
            return batch_size, drop_last
        batch_size = _sampler_batch_size(options, batch_size, shuffle, sampler, partition)
        self.batch_sampler_drop_last = drop_last
        return batch_size, None

    def _set_sizes(self, options: Options, batch_size: int | None) -> None:
        if batch_size is None:
            self._num_batches_to_combine = self._combined_batch_size = None
            return
        groups = options.replication_factor // options.input_group_size
        per_call = options.device_iterations * groups * options.Training.gradient_accumulation
        self._num_batches_to_combine = per_call
        self._combined_batch_size = batch_size * per_call

    def _partition(self, dataset, options, shuffle, num_workers, partition, kwargs) -> tuple:
        """(data set, shuffle for torch): this process's share when Distributed asks for it."""
        self._is_iterable = isinstance(dataset, torch.utils.data.IterableDataset)
        self._shuffle_shares = False
        if self._is_iterable:
            _check_iterable(options, partition, num_workers, kwargs)
            return dataset, shuffle
        return self._map_style(dataset, options, bool(shuffle), partition)

    def _map_style(self, dataset, options, shuffle, auto_partition) -> tuple:
        drop_last = self._real_drop_last
        if not drop_last:
            self._warn_remainder(dataset, options)
        if options.Distributed.numProcesses > 1 and auto_partition:
            if shuffle and options.random_seed is None:
                raise AssertionError(
                    "When using auto_distributed_partitioning you must set "
                    "poptorch.Options.randomSeed() to ensure that tensors are in the same "
                    "order in all processes."
                )
            if self._combined_batch_size is None:
                raise AssertionError(
                    "batch_size=None not allowed when using auto_distributed_partitioning."
                )
            dataset = _ProcessShare(dataset, options, self._combined_batch_size, drop_last)
            # the shares are shuffled together (one permutation for all processes), not each
            self._shuffle_shares, shuffle = shuffle, False
        return dataset, shuffle

    def _warn_remainder(self, dataset, options: Options) -> None:
        if self._user_batch_sampler:
            logger.warning(
                "drop_last=False with a batch_sampler: the last tensor may hold fewer than %d "
                "of its batches. To avoid having to handle this special case switch to "
                "drop_last=True.",
                self._num_batches_to_combine,
            )
            return
        step = (self._combined_batch_size or 0) * options.Distributed.numProcesses
        if step and len(dataset) % step:
            logger.warning(
                "The number of elements in the dataset (%d) is not divisible by the number of "
                "elements processed per step (%d) and drop_last=False. The last tensor will "
                "have a batch size of %d. To avoid having to handle this special case switch "
                "to drop_last=True",
                len(dataset),
                step,
                len(dataset) % step,
            )

    def _rebatching(self, mode, worker_size) -> tuple:
        """(mode, rebatched size, batch size the workers load)."""
        mode = DataLoaderMode(mode)
        cbs = self._combined_batch_size
        load_batch = 1 if self._user_batch_sampler else cbs
        remainder = mode == DataLoaderMode.Async and not self._real_drop_last and (cbs or 0) > 1
        if mode != DataLoaderMode.AsyncRebatched and not remainder:
            return mode, None, load_batch
        if worker_size is not None:
            if worker_size > cbs:
                raise AssertionError(
                    f"The rebatched_worker_size ({worker_size}) must be <= to the combined "
                    f"batch size ({cbs})"
                )
            load_batch = worker_size
        return DataLoaderMode.Async, cbs, load_batch

    def __len__(self) -> int:
        rebatched = self._accessor.rebatched_size if self._accessor is not None else None
        if not rebatched:
            return super().__len__()
        length = len(self.dataset)
        full = length // rebatched
        return full + int(not self.rebatched_drop_last and length % rebatched != 0)

    def __iter__(self):
        if self._shuffle_shares:
            self.dataset.shuffle_global_indices()
            self.dataset.swap_range()
        if self._accessor is not None:
            return iter(self._accessor)
        if self._user_batch_sampler and self._num_batches_to_combine != 1:
            return _combined(
                super().__iter__(), self._num_batches_to_combine, self.batch_sampler_drop_last
            )
        return super().__iter__()

    def __getstate__(self) -> dict:
        # the worker process iterates its copy synchronously: it gets no accessor
        return {**self.__dict__, "_accessor": None, "_iterator": None}

    @property
    def combinedBatchSize(self) -> int | None:
        """Samples per item: batch_size x the options' device iterations, replicas and
        micro-batches."""
        return self._combined_batch_size

    @property
    def options(self) -> Options:
        return self._options

    def terminate(self) -> None:
        """Stop the asynchronous worker process (Async modes; nothing otherwise)."""
        accessor = getattr(self, "_accessor", None)
        if accessor is not None:
            accessor.terminate()

    def __del__(self) -> None:
        self.terminate()


def _persistent(persistent_workers: bool | None, num_workers: int) -> bool:
    return num_workers > 0 if persistent_workers is None else persistent_workers


def _check_options(options) -> None:
    if not isinstance(options, Options):
        raise Error(
            f"poptorch.DataLoader's first argument is the poptorch.Options, not a "
            f"{type(options).__name__}."
        )


def _sampler_batch_size(options, batch_size, shuffle, batch_sampler, auto_partition) -> int:
    if batch_size != 1 or shuffle:
        raise Error("`batch_sampler` option is mutually exclusive with batch_size, shuffle.")
    if options.Distributed.numProcesses > 1 and auto_partition:
        raise Error(
            "`batch_sampler` option is mutually exclusive with auto_distributed_partitioning=True."
        )
    return getattr(batch_sampler, "batch_size", batch_size)


def _check_iterable(options, auto_partition: bool, num_workers: int, kwargs: dict) -> None:
    if auto_partition and options.Distributed.numProcesses != 1:
        raise AssertionError("auto_distributed_partitioning not supported for IterableDataset")
    if num_workers > 1 and "worker_init_fn" not in kwargs:
        logger.warning(
            "IterableDataset used with num_workers=%d but no worker_init_fn specified: as a "
            "result the DataLoader will return %d times each element in the dataset (See "
            "torch.utils.data.IterableDataset's documentation for more information)",
            num_workers,
            num_workers,
        )


def _async_options(async_options: dict | None) -> dict:
    async_options = dict(async_options or {})
    if "rebatched_size" in async_options:
        raise AssertionError(
            "You cannot use DataLoaderMode.AsyncRebatched and manually specify the "
            "rebatched_size in async_options"
        )
    return async_options


def _combined(batches, count: int, drop_last: bool):
    """``count`` consecutive batches of a batch sampler joined along dim 0 (a shorter last
    one unless ``drop_last``)."""
    group = []
    for batch in batches:
        group.append(batch)
        if len(group) == count:
            yield _join(group)
            group = []
    if group and not drop_last:
        yield _join(group)


def _join(batches: list) -> Any:
    columns = zip(*(_data_ring.leaves(b) for b in batches))
    return _data_ring.rebuild(batches[0], iter([torch.cat(c) for c in columns]))


class _ProcessShare(torch.utils.data.Dataset):
    """This process's block of a data set split over ``Distributed`` processes.

    With ``drop_last`` every process gets the same number of whole combined batches; without
    it the elements are spread as evenly as they go. Shuffling permutes the whole data set with
    the options' seed (the same permutation in every process), and every other pass starts
    the block after the elements the last one left over, so all of them get used.
    """

    def __init__(self, dataset, options: Options, step: int, drop_last: bool) -> None:
        procs, proc = options.Distributed.numProcesses, options.Distributed.processId
        total = len(dataset)
        if drop_last:
            per_proc = step * (total // (step * procs))
            self._base = proc * per_proc
            self._length = min(per_proc, total - self._base)
            self._leftovers = total % per_proc if per_proc else 0
        else:
            sizes = [total // procs + (total % procs > p) for p in range(procs)]
            self._base, self._length, self._leftovers = sum(sizes[:proc]), sizes[proc], 0
        self._offset, self._dataset = self._base, dataset
        self._seed, self._generator_state, self._order = options.random_seed, None, None

    def shuffle_global_indices(self) -> None:
        """A new permutation of the whole data set, the same in every process."""
        generator = torch.Generator()
        if self._generator_state is None:
            generator.manual_seed(self._seed)
        else:
            generator.set_state(self._generator_state)
        order = torch.randperm(len(self._dataset), generator=generator)
        self._generator_state = generator.get_state()
        if self._order is None:
            self._order = order.share_memory_()  # torch's workers see the next ones too
        else:
            self._order.copy_(order)

    def swap_range(self) -> None:
        """Alternate the block's start between its base and past the left-over elements."""
        at_base = self._offset == self._base
        self._offset = self._base + self._leftovers if at_base else self._base

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: int):
        position = index + self._offset
        if self._order is not None:
            position = int(self._order[position])
        return self._dataset[position]
