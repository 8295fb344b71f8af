"""Core behaviours Graphcore's PopXL tests rely on (issue 9), each against a direct reference:
call-site by-reference inputs, and the Session's errors worded as in PopXL."""

from __future__ import annotations

import numpy as np
import pytest

import popxl_core as popxl
from popxl_core import ops


def _accumulate_twice(modify_second: bool) -> tuple:
    ir = popxl.Ir()
    with ir.main_graph, popxl.in_sequence():
        x = popxl.variable(np.float32(1.5), name="x")
        sg = ir.create_graph(lambda t: ops.var_updates.accumulate_(t, popxl.constant(2.0)), x)
        ops.call(sg, x)
        first = popxl.d2h_stream(x.shape, x.dtype, "first")
        ops.host_store(first, x)
        info = ops.call_with_info(sg, x)
        if modify_second:
            info.set_parent_input_modified(x)
        second = popxl.d2h_stream(x.shape, x.dtype, "second")
        ops.host_store(second, x)
    with popxl.Session(ir, "ipu_model") as session:
        out = session.run()
        final = session.get_tensor_data(x)
    return out[first], out[second], final


def test_call_copies_inputs_unless_parent_input_modified():
    # a plain call works on a copy: the parent variable keeps 1.5
    assert _accumulate_twice(False) == (1.5, 1.5, 1.5)
    # set_parent_input_modified passes x by reference: the second call adds 2 to it
    assert _accumulate_twice(True) == (1.5, 3.5, 3.5)


def test_session_tensor_data_errors_use_popxl_wording():
    ir = popxl.Ir()
    with ir.main_graph:
        c = popxl.constant(np.ones(2, np.float32), name="c")
        v = popxl.variable(np.ones(2, np.float32), name="v")
        s = ops.add(c, v)
    session = popxl.Session(ir, "ipu_model")
    with pytest.raises(TypeError, match=f"^Tensor {s.id} is not of type Constant or Variable"):
        session.get_tensor_data(s)
    np.testing.assert_array_equal(session.get_tensor_data(c), np.ones(2, np.float32))
    with session:
        with pytest.raises(TypeError, match=f"^Tensor {c.id} is not of type Variable"):
            session.write_variable_data(c, np.zeros(2, np.float32))


# print_tensor: PopXL's default title, gradient title and bracket/separator options --------
def _run_printing(build) -> str:
    import contextlib
    import io

    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.array([0.0, 1.5, -2.0], np.float32), name="x")
        graph = ir.create_graph(build, x)
        grad = popxl.transforms.autodiff(graph)
        site = ops.call_with_info(graph, x)
        ops.call(
            grad.graph, popxl.constant(np.ones(3, np.float32)), inputs_dict=grad.inputs_dict(site)
        )
    err = io.StringIO()
    with contextlib.redirect_stderr(err), popxl.Session(ir, "ipu_model") as session:
        session.run()
    return err.getvalue()


def test_print_tensor_default_title_and_gradient_title():
    text = _run_printing(lambda x: ops.print_tensor(x, print_gradient=True) * 2.0)
    assert text.splitlines() == ["print_x: [ 0.   1.5 -2. ]", "print_x_gradient: [2. 2. 2.]"]


def test_print_tensor_brackets_separator_and_fixed_format():
    text = _run_printing(
        lambda t: ops.print_tensor(
            t,
            "w",
            open_bracket="<",
            close_bracket=">",
            separator=", ",
            float_format="fixed",
            digits=2,
        )
    )
    assert text.splitlines() == ["w: <0.00, 1.50, -2.00>"]
    with pytest.raises(ValueError, match="float_format must be one of"):
        _run_printing(lambda t: ops.print_tensor(t, float_format="hex"))
