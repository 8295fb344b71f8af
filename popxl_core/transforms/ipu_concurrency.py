"""Ops that run at the same time on different IPUs, for the simulator's cycle estimate.

A pipeline's time step runs each stage on its own IPU at once (ipu_model.md: IPUs are separate
processors; a multi-IPU program is one BSP program whose compute phases run on every IPU
together). Ops created inside `concurrent_ipus()` are recorded as one such step (on each op,
`Op.concurrency_group`): the cost model
charges the step the cycles of its busiest IPU plus its inter-IPU copies, instead of the sum
over all IPUs. Like `merge_exchange` it changes estimates, never results.
"""

from __future__ import annotations

import contextlib
import itertools
from typing import Iterator, List, Optional

from ..context import ops_created

__all__ = ["concurrent_ipus", "concurrency_group", "concurrent_runs"]

_GROUP_IDS = itertools.count(1)


@contextlib.contextmanager
def concurrent_ipus() -> Iterator[None]:
    """Record the ops created inside as one step whose IPUs run concurrently."""
    with ops_created() as created:
        yield
    group = next(_GROUP_IDS)
    for op in created:
        op.concurrency_group = group


def concurrency_group(op) -> Optional[int]:
    """The concurrent step ``op`` was created in; None for an op made outside any."""
    return op.concurrency_group


def concurrent_runs(ops: List) -> List[List]:
    """``ops`` (a schedule) cut into runs: consecutive ops of one concurrent step together,
    every other op alone."""
    runs: List[List] = []
    last = None
    for op in ops:
        group = op.concurrency_group
        if group is not None and group == last:
            runs[-1].append(op)
        else:
            runs.append([op])
        last = group
    return runs
