"""`foreach.foreach_schedule`'s fast path: a live schedule where no two ops share a group key
comes back as it is, without the dependency analysis, exactly as the full sort returns it."""

from __future__ import annotations

import numpy as np

import popxl_core as popxl
from popxl_core import ops
from popxl_core.sim import foreach
from popxl_core.sim.foreach import foreach_schedule
from popxl_core.sim.passes import live_ops


def _live(build) -> list:
    ir = popxl.Ir()
    with ir.main_graph, popxl.in_sequence():
        a = popxl.variable(np.ones((2, 3), np.float32), name="a")
        b = popxl.variable(np.ones((3,), np.float32), name="b")
        build(a, b)
    return live_ops(ir.main_graph, ir.main_graph._outputs)


def _one_of_each(a, b):
    y = ops.sqrt(a) * 2.0
    ops.var_updates.accumulate_(b, ops.reduce_sum(y, [0]))


def _two_accumulates(a, b):
    ops.var_updates.accumulate_(a, ops.sqrt(a))
    ops.var_updates.accumulate_(b, popxl.constant(np.ones(3, np.float32)))


def _full_sort(live: list) -> tuple:
    keys = foreach._group_keys(live, None)
    return foreach._ReadyQueue(live, foreach._dependencies(live), keys).drain()


def test_no_shared_key_returns_the_schedule_without_the_dependency_analysis(monkeypatch):
    live = _live(_one_of_each)
    assert _full_sort(live) == (live, [])  # what the fast path gives, by the full sort
    calls = []
    monkeypatch.setattr(foreach, "_dependencies", lambda ops: calls.append(ops) or {})
    assert foreach_schedule(live) == (live, [])
    assert not calls


def test_a_shared_key_still_groups():
    live = _live(_two_accumulates)
    order, groups = foreach_schedule(live)
    assert (order, groups) == _full_sort(live)
    assert [len(g.ops) for g in groups] == [2]
