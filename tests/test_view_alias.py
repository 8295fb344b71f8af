"""Returned views are copied exactly where an alias could be observed (sim/alias.py).

Each program returns a view (transpose) of a subgraph input or of a tensor made in the
subgraph, and the caller writes one side in place; the stored values must be PopXL's (views
are copies), compared exactly with numpy, and the copy must be left out where it is safe.
"""

from __future__ import annotations

import numpy as np

import popxl_core as popxl
from popxl_core import ops

W0 = np.arange(6, dtype=np.float32).reshape(2, 3)


def _copies(session) -> int:
    """How many compiled view kernels copy their result."""
    prog = session._program
    return sum(
        1
        for name, op in prog.kernel_ops.items()
        if op.opdef.view and getattr(prog.namespace[name], "__name__", "") == "copied"
    )


def _build(write_after: str, read_after: bool):
    """main: t = call(transpose)(w); then optionally w += 10 or t += 10; store t (and w)."""
    ir = popxl.Ir()
    with ir.main_graph, popxl.in_sequence():
        w = popxl.variable(W0, name="w")
        g = ir.create_graph(lambda a: ops.transpose(a, (1, 0)), w)
        (t,) = ops.call(g, w)
        out_t = popxl.d2h_stream((3, 2), popxl.float32, "t")
        if not read_after:
            ops.host_store(out_t, t)
        if write_after == "input":
            ops.scaled_add_(w, popxl.constant(np.ones((2, 3), np.float32)), b=10.0)
        elif write_after == "view":
            ops.scaled_add_(t, popxl.constant(np.ones((3, 2), np.float32)), b=10.0)
        if read_after:
            ops.host_store(out_t, t)
        out_w = popxl.d2h_stream((2, 3), popxl.float32, "w_out")
        ops.host_store(out_w, w)
    return ir, out_t, out_w


def _run(write_after: str, read_after: bool):
    ir, out_t, out_w = _build(write_after, read_after)
    with popxl.Session(ir, "ipu_hw") as session:
        res = session.run()
        return res[out_t], res[out_w], _copies(session)


def test_view_read_before_the_input_is_written_is_not_copied():
    t, w, copies = _run("input", read_after=False)
    np.testing.assert_array_equal(t, W0.T)
    np.testing.assert_array_equal(w, W0 + 10.0)
    assert copies == 0


def test_view_read_after_the_input_is_written_keeps_the_old_value():
    t, w, copies = _run("input", read_after=True)
    np.testing.assert_array_equal(t, W0.T)  # PopXL: the transpose is a copy
    np.testing.assert_array_equal(w, W0 + 10.0)
    assert copies == 1


def test_writing_the_returned_view_leaves_the_input_alone():
    t, w, copies = _run("view", read_after=True)
    np.testing.assert_array_equal(t, W0.T + 10.0)
    np.testing.assert_array_equal(w, W0)
    assert copies == 1


def test_no_write_no_copy():
    t, w, copies = _run("none", read_after=True)
    np.testing.assert_array_equal(t, W0.T)
    np.testing.assert_array_equal(w, W0)
    assert copies == 0


def test_view_of_a_fresh_tensor_is_not_copied_unless_shared():
    ir = popxl.Ir()
    with ir.main_graph, popxl.in_sequence():
        w = popxl.variable(W0, name="w")
        g = ir.create_graph(lambda a: (a * 2.0, ops.transpose(a * 3.0, (1, 0))), w)
        shared = ir.create_graph(lambda a: ((y := a * 2.0), ops.transpose(y, (1, 0))), w)
        y1, t1 = ops.call(g, w)
        y2, t2 = ops.call(shared, w)
        ops.scaled_add_(y2, popxl.constant(np.ones((2, 3), np.float32)), b=1.0)
        outs = [popxl.d2h_stream(t.shape, popxl.float32, f"o{i}") for i, t in enumerate([t1, t2])]
        for s, t in zip(outs, [t1, t2]):
            ops.host_store(s, t)
    with popxl.Session(ir, "ipu_hw") as session:
        res = session.run()
        np.testing.assert_array_equal(res[outs[0]], (W0 * 3.0).T)
        np.testing.assert_array_equal(res[outs[1]], (W0 * 2.0).T)  # y2 += 1 must not show
        assert _copies(session) == 1
