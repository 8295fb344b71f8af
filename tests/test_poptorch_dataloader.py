"""poptorch.DataLoader and AsynchronousDataAccessor against torch's own DataLoader."""

from __future__ import annotations

import copy
import re
import subprocess
import sys
import time

import pytest
import torch

import popxl_fx.poptorch as poptorch
from popxl_fx import compat

FORK = {"sharing_strategy": poptorch.SharingStrategy.Fork}  # quick to start in a test


class Numbers(torch.utils.data.Dataset):
    """Element i is a [2] tensor full of i."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        if index >= self.length:  # ends iter(dataset), as a sequence ends
            raise IndexError(index)
        return torch.full((2,), float(index))


class Pairs(Numbers):
    def __getitem__(self, index: int) -> dict:
        return {"x": torch.full((2,), float(index)), "y": torch.tensor([index])}


class Stream(torch.utils.data.IterableDataset):
    """0..length-1; each torch worker takes its own contiguous part."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        workers, me = (1, 0) if info is None else (info.num_workers, info.id)
        per = -(-self.length // workers)
        for i in range(me * per, min(self.length, (me + 1) * per)):
            yield torch.full((2,), float(i))


class Broken(Numbers):
    def __getitem__(self, index: int):
        raise ValueError("a broken data set")


def _firsts(loader) -> list[int]:
    return [int(v) for batch in loader for v in batch[:, 0]]


def _loader(dataset, mode, **kwargs):
    opts = poptorch.Options().deviceIterations(2)
    if mode != poptorch.DataLoaderMode.Sync:
        kwargs["async_options"] = {**FORK, **kwargs.get("async_options", {})}
    return poptorch.DataLoader(opts, dataset, mode=mode, **kwargs)


def test_async_yields_the_sync_batches_every_pass():
    sync = _loader(Numbers(21), poptorch.DataLoaderMode.Sync, batch_size=3)
    loader = _loader(Numbers(21), poptorch.DataLoaderMode.Async, batch_size=3)
    expected = _firsts(sync)
    assert expected == list(range(18)) and len(loader) == len(sync) == 3
    assert _firsts(loader) == expected and _firsts(loader) == expected
    loader.terminate()


def test_async_restarts_a_pass_left_part_way():
    loader = _loader(Numbers(20), poptorch.DataLoaderMode.Async, batch_size=2)
    first = next(iter(loader))
    assert first[:, 0].tolist() == [0, 1, 2, 3]
    assert _firsts(loader) == list(range(20))
    loader.terminate()


def test_async_keeps_dicts_and_dtypes():
    loader = _loader(Pairs(8), poptorch.DataLoaderMode.Async, batch_size=2)
    batches = [{k: v.clone() for k, v in b.items()} for b in loader]
    reference = list(_loader(Pairs(8), poptorch.DataLoaderMode.Sync, batch_size=2))
    assert len(batches) == 2
    for got, want in zip(batches, reference):
        assert got.keys() == want.keys()
        assert all(torch.equal(got[k], want[k]) for k in got)
    loader.terminate()


@pytest.mark.parametrize("drop_last", [True, False])
def test_rebatched_workers_give_every_element_once(drop_last):
    loader = _loader(
        Stream(23),
        poptorch.DataLoaderMode.AsyncRebatched,
        batch_size=2,
        num_workers=2,
        drop_last=drop_last,
        rebatched_worker_size=3,
    )
    for _ in range(2):
        batches = [b.clone() for b in loader]
        values = [int(v) for b in batches for v in b[:, 0]]
        # workers interleave: with drop_last the 3 left over are whichever come last
        assert len(values) == len(set(values)) == (20 if drop_last else 23)
        assert set(values) <= set(range(23))
        assert all(len(b) == 4 for b in batches[: 5 if drop_last else -1])
    loader.terminate()


def test_async_with_remainder_rebatches_and_counts_it():
    loader = _loader(Numbers(11), poptorch.DataLoaderMode.Async, batch_size=2, drop_last=False)
    assert len(loader) == 3
    assert [len(b) for b in loader] == [4, 4, 3]
    loader.terminate()


def test_batch_sampler_batches_are_combined():
    sampler = torch.utils.data.BatchSampler(
        torch.utils.data.SequentialSampler(range(11)), batch_size=2, drop_last=False
    )
    opts = poptorch.Options().deviceIterations(2)
    loader = poptorch.DataLoader(opts, Numbers(11), batch_sampler=sampler, drop_last=False)
    assert [b[:, 0].tolist() for b in loader][-2:] == [[4, 5, 6, 7], [8, 9, 10]]
    # drop_last drops a last group of fewer batches than a call takes (6 = 4 + 2 here)
    opts = poptorch.Options().deviceIterations(4)
    keep = poptorch.DataLoader(opts, Numbers(11), batch_sampler=sampler, drop_last=True)
    assert [len(b) for b in keep] == [8]


def test_batch_size_none_yields_elements():
    loader = _loader(
        Stream(4), poptorch.DataLoaderMode.Async, batch_size=None, drop_last=False, num_workers=1
    )
    assert [b.tolist() for b in loader] == [[float(i)] * 2 for i in range(4)]
    loader.terminate()


def test_distributed_shuffle_is_shared_and_covers_the_leftovers():
    seen = []
    for process in range(2):
        opts = poptorch.Options().randomSeed(3)
        opts.Distributed.configureProcessId(process, 2)
        loader = poptorch.DataLoader(opts, Numbers(10), batch_size=2, shuffle=True)
        seen.append([_firsts(loader), _firsts(loader)])
    first_pass = seen[0][0] + seen[1][0]
    assert len(set(first_pass)) == 8  # two processes, disjoint, 2 whole batches each
    assert set(first_pass + seen[0][1] + seen[1][1]) == set(range(10))


def test_early_preload_fills_the_ring():
    loader = _loader(
        Numbers(10),
        poptorch.DataLoaderMode.Async,
        batch_size=1,
        async_options={"early_preload": True, "buffer_size": 4},
    )
    lazy = _loader(Numbers(10), poptorch.DataLoaderMode.Async, batch_size=1)
    ready = loader._accessor._worker._data_buffers.indices_mem
    lazy_ready = lazy._accessor._worker._data_buffers.indices_mem
    # the workers start on a machine that may be busy: wait for what each loads unasked
    deadline = time.monotonic() + 60
    while (int(ready.sum()) < 4 or int(lazy_ready.sum()) < 1) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert int(ready.sum()) == 4
    assert int(lazy_ready.sum()) == 1
    loader.terminate()
    lazy.terminate()


def test_a_failing_data_set_says_the_worker_failed_to_start():
    loader = poptorch.DataLoader(poptorch.Options(), Broken(4))
    with pytest.raises(poptorch.Error, match="worker thread failed to start"):
        poptorch.AsynchronousDataAccessor(loader, **FORK)


def test_python_subprocesses_of_a_poptorch_program_import_poptorch_and_log_as_poptorch():
    script = (
        "import poptorch, popxl_fx.poptorch as real\n"
        "assert poptorch is real\n"
        "poptorch._logging.logger.debug('hello from %s', 'the child')\n"
    )
    env = {**compat.child_env(), "POPTORCH_LOG_LEVEL": "DEBUG"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    line = r"\[\d\d:\d\d:\d\d\.\d{3}\] \[poptorch::python\] \[debug\] hello from the child"
    assert re.fullmatch(line + "\n", done.stderr), done.stderr


def test_an_async_loader_is_not_wrapped_twice_nor_a_remainder_left_unrebatched():
    loader = _loader(Numbers(8), poptorch.DataLoaderMode.Async, batch_size=2)
    with pytest.raises(poptorch.Error, match="already uses an AsynchronousDataAccessor"):
        poptorch.AsynchronousDataAccessor(loader, **FORK)
    loader.terminate()
    sync = _loader(Numbers(9), poptorch.DataLoaderMode.Sync, batch_size=2, drop_last=False)
    with pytest.raises(AssertionError, match="only works if 'rebatched_size'"):
        poptorch.AsynchronousDataAccessor(sync, **FORK)
    rebatched = poptorch.AsynchronousDataAccessor(sync, rebatched_size=4, **FORK)
    # as PopTorch's: only a loader that rebatches itself keeps the remainder
    assert [len(b) for b in rebatched] == [4, 4]
    rebatched.terminate()


def test_a_loader_freezes_its_options_and_a_deep_copy_is_unfrozen():
    opts = poptorch.Options()
    poptorch.DataLoader(opts, Numbers(4))
    with pytest.raises(AttributeError, match="frozen"):
        opts.deviceIterations(2)
    assert copy.deepcopy(opts).deviceIterations(2).device_iterations == 2


def test_an_exhausted_pass_stays_exhausted_until_the_next_one():
    accessor = poptorch.AsynchronousDataAccessor(Numbers(2), **FORK)
    assert [int(next(accessor)[0]), int(next(accessor)[0])] == [0, 1]
    for _ in range(2):
        with pytest.raises(StopIteration):
            next(accessor)
    assert [int(x[0]) for x in accessor] == [0, 1]
    accessor.terminate()
