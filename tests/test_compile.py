"""The compiler: plan and compile once, run many; dead ops dropped; copies where aliasing bites."""

from __future__ import annotations

import numpy as np

import popxl_core as popxl
from popxl_core import ops
from popxl_core import schedule as schedule_module
from popxl_core.sim import compile as compile_module


def _program():
    ir = popxl.Ir()
    with ir.main_graph:
        s = popxl.h2d_stream((2, 3), popxl.float32, "x")
        x = ops.host_load(s, "x")
        w = popxl.variable(np.ones((2, 3), np.float32), name="w")
        g = ir.create_graph(lambda a, b: a * b + a, x, w)
        (y,) = ops.call(g, x, w)
        out = popxl.d2h_stream(y.shape, y.dtype, "y")
        ops.host_store(out, y)
    return ir, s, out


def test_runs_never_walk_the_ir_again(monkeypatch):
    ir, s, out = _program()
    session = popxl.Session(ir, "ipu_hw")

    def forbidden(*args, **kwargs):
        raise AssertionError("the IR was re-scheduled during a run")

    monkeypatch.setattr(schedule_module, "schedule", forbidden)
    monkeypatch.setattr(compile_module, "schedule", forbidden)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    with session:
        for _ in range(3):
            np.testing.assert_array_equal(session.run({s: x})[out], x * 1 + x)


def test_dead_ops_are_not_emitted():
    ir = popxl.Ir()
    with ir.main_graph:
        s = popxl.h2d_stream((2,), popxl.float32, "x")
        x = ops.host_load(s, "x")
        unused = x * 3.0  # noqa: F841 - nothing reads it
        out = popxl.d2h_stream((2,), popxl.float32, "y")
        ops.host_store(out, x + 1.0)
    session = popxl.Session(ir, "ipu_hw")
    source = session._program.main.source
    # only the Add (a direct torch call, sim/direct.py); the Mul and host_load's Init are dropped
    assert source.count(" = k") == 0 and "torch.add(" in source and "torch.mul(" not in source
    with session:
        np.testing.assert_array_equal(session.run({s: np.ones(2, np.float32)})[out], [2.0, 2.0])


def test_view_then_inplace_update_does_not_leak_into_the_view():
    ir = popxl.Ir()
    with ir.main_graph, popxl.in_sequence():
        w = popxl.variable(np.arange(6, dtype=np.float32), name="w")
        r = ops.reshape(w, (2, 3))  # a copy in popxl semantics, a view for torch
        ops.scaled_add_(w, popxl.constant(np.ones(6, np.float32)), b=10.0)
        out = popxl.d2h_stream((2, 3), popxl.float32, "r")
        ops.host_store(out, r)
    with popxl.Session(ir, "ipu_hw") as session:
        got = session.run()[out]
        np.testing.assert_array_equal(got, np.arange(6, dtype=np.float32).reshape(2, 3))
        np.testing.assert_array_equal(session.get_tensor_data(w), np.arange(6) + 10.0)


def test_subgraph_writing_a_plain_input_leaves_the_caller_value_alone():
    ir = popxl.Ir()
    with ir.main_graph:
        w = popxl.variable(np.zeros(3, np.float32), name="w")

        def bump(a):
            return ops.add_(a, popxl.constant(np.ones(3, np.float32)))

        g = ir.create_graph(bump, w)
        (y,) = ops.call(g, w)
        out = popxl.d2h_stream((3,), popxl.float32, "y")
        ops.host_store(out, y)
    with popxl.Session(ir, "ipu_hw") as session:
        np.testing.assert_array_equal(session.run()[out], [1.0, 1.0, 1.0])
        np.testing.assert_array_equal(session.get_tensor_data(w), [0.0, 0.0, 0.0])


def test_conditional_takes_the_branch_the_runtime_value_selects():
    ir = popxl.Ir()
    with ir.main_graph:
        flag_stream = popxl.h2d_stream((), popxl.bool, "flag")
        flag = ops.host_load(flag_stream)
        x = popxl.variable(np.arange(3, dtype=np.float32), name="x")
        double = ir.create_graph(lambda a: a * 2.0, x)
        negate = ir.create_graph(lambda a: -a, x)
        (y,) = ops.conditional(flag, double, negate, then_inputs=[x], else_inputs=[x])
        out = popxl.d2h_stream(y.shape, y.dtype, "y")
        ops.host_store(out, y)
    with popxl.Session(ir, "ipu_hw") as session:
        np.testing.assert_array_equal(session.run({flag_stream: np.bool_(True)})[out], [0, 2, 4])
        np.testing.assert_array_equal(session.run({flag_stream: np.bool_(False)})[out], [0, -1, -2])
