"""PopART's inplacing ambiguity check (Graphcore's test_inplacing): with the session option
enableInplaceAmbiguityChecking set, a Session refuses an in-place write that is not ordered
against another use of the same storage; ordered programs, and every program with the option
off, run (it is on by default: tests/test_pipeline_ordering.py)."""

from __future__ import annotations

import numpy as np
import pytest

import popxl_core as popxl
from popxl_core import ops
from popxl_core.sim.ambiguity import InplaceAmbiguityError

X = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)


def _session(ir, check=True):
    ir._pb_ir.getSessionOptions().enableInplaceAmbiguityChecking = check
    return popxl.Session(ir, "ipu_model")


def _two_writes(sequenced: bool):
    ir = popxl.Ir()
    with ir.main_graph, popxl.in_sequence() if sequenced else popxl.in_sequence(False):
        a = popxl.variable(X, name="a")
        b = ops.relu_(a)
        c = ops.gelu_(a)
        for t in (b, c):
            ops.host_store(popxl.d2h_stream(t.shape, t.dtype), t)
    return ir


def test_unordered_in_place_writes_are_refused():
    with pytest.raises(InplaceAmbiguityError, match="^Inplacing ambiguity detected. In graph"):
        _session(_two_writes(False))
    _session(_two_writes(True))  # in_sequence orders them
    _session(_two_writes(False), check=False)  # the option off


def test_read_and_write_through_views_and_subgraphs():
    ir = popxl.Ir()
    with ir.main_graph:
        a = popxl.variable(X, name="a")
        r = ops.relu(ops.reshape(a, (3, 2)))  # reads a through a view
        ops.var_updates.copy_var_update_(a, popxl.variable(X * 2, name="b"))
        ops.host_store(popxl.d2h_stream(r.shape, r.dtype), r)
    with pytest.raises(InplaceAmbiguityError, match="CopyVarUpdate"):
        _session(ir)

    ir = popxl.Ir()
    sub = ir.create_empty_graph("sub")
    with sub:
        w0 = popxl.graph_input(X.shape, popxl.float32, "w0")
        w1 = popxl.graph_input(X.shape, popxl.float32, "w1")
        popxl.graph_output(ops.relu_(w0))
        popxl.graph_output(ops.add_(w0, w1))
    with ir.main_graph:
        ops.call(sub, popxl.variable(X), popxl.variable(X))
    with pytest.raises(InplaceAmbiguityError, match="In graph 'sub_subgraph"):
        _session(ir)


def test_data_order_is_enough():
    ir = popxl.Ir()
    with ir.main_graph:
        a = popxl.variable(X, name="a")
        b = ops.relu(a)
        c = ops.relu(a)
        d = ops.add_(b, c)  # writes b, which only its producer made: no other user
        e = ops.relu_(d)  # after add_ by data
        ops.host_store(popxl.d2h_stream(e.shape, e.dtype), e)
    with _session(ir) as sess:
        out = sess.run()
    np.testing.assert_array_equal(list(out.values())[0], np.maximum(2 * np.maximum(X, 0), 0))
