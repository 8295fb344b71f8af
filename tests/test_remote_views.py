"""Remote loads as views of their entry (`popxl_core.sim.remote_views`): where nothing can
tell the difference a load allocates no copy; everywhere else the copy's numbers stay.
Values are moved and added, so every check is exact."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch._C._profiler import _EventType

import popxl_core as popxl
from popxl_core import ops

SHAPE = (64, 64)  # 16 KiB: the only allocations of this size in a run are copies of it


def _store(t, name):
    s = popxl.d2h_stream(t.shape, t.dtype, name)
    ops.host_store(s, t)
    return s


def _program(body):
    """``body(buf, x)`` with ``x`` loaded from the entry of remote variable w (2.0)."""
    ir = popxl.Ir()
    with ir.main_graph, popxl.in_sequence():
        buf = popxl.remote_buffer(SHAPE, popxl.float32, entries=2)
        w = popxl.remote_variable(np.full(SHAPE, 2.0, np.float32), buf, 1, name="w")
        s = _store(body(buf, ops.remote_load(buf, 1)), "out")
    return ir, w, s


def _copies(fn) -> int:
    """How many entry-sized torch tensors ``fn()`` allocates."""
    nbytes = int(np.prod(SHAPE)) * 4
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True
    ) as prof:
        fn()
    found = []

    def walk(node):
        if node.tag == _EventType.Allocation and node.extra_fields.alloc_size == nbytes:
            found.append(node)
        for child in node.children:
            walk(child)

    for root in prof.profiler.kineto_results.experimental_event_tree():
        walk(root)
    return len(found)


def _run_twice(body):
    """(out and w after each of two runs, entry-sized allocations of the second run)."""
    ir, w, s = _program(body)
    seen = []
    with popxl.Session(ir, "ipu_model") as session:
        seen.append((session.run()[s][0, 0], session.get_tensor_data(w)[0, 0]))
        copies = _copies(
            lambda: seen.append((session.run()[s][0, 0], session.get_tensor_data(w)[0, 0]))
        )
    return seen, copies


def _add_(t, value):
    return ops.add_(t, popxl.constant(np.full(SHAPE, value, np.float32)))


def test_load_update_store_back_is_the_entry():
    def body(buf, x):
        x = _add_(x, 1.0)
        ops.remote_store(buf, 1, x)
        return x

    seen, copies = _run_twice(body)
    assert seen == [(3.0, 3.0), (4.0, 4.0)]
    assert copies == 0  # before: a copy of the entry every run


def test_a_load_read_before_the_entry_is_stored_is_the_entry():
    def body(buf, x):
        y = x * 3.0
        ops.remote_store(buf, 1, y)
        return y

    seen, copies = _run_twice(body)
    assert seen == [(6.0, 6.0), (18.0, 18.0)]
    assert copies == 1  # the product, not the load


@pytest.mark.parametrize(
    "case",
    ["read_after_another_store", "written_not_stored", "written_after_store_back"],
)
def test_a_load_the_difference_shows_in_stays_a_copy(case):
    def body(buf, x):
        if case == "read_after_another_store":
            ops.remote_store(buf, 1, popxl.constant(np.full(SHAPE, 5.0, np.float32)))
            return x + 0.0
        x = _add_(x, 1.0)
        if case == "written_after_store_back":
            ops.remote_store(buf, 1, x)
            x = _add_(x, 10.0)
        return x

    expected = {
        "read_after_another_store": [(2.0, 5.0), (5.0, 5.0)],
        "written_not_stored": [(3.0, 2.0), (3.0, 2.0)],
        "written_after_store_back": [(13.0, 3.0), (14.0, 4.0)],
    }
    seen, copies = _run_twice(body)
    assert seen == expected[case]
    assert copies >= 1
