"""Misuse cases of issue 8, item 5 and beyond: other Irs, recursion, outputs, run-time values,
overflow, and everyday slips."""

from __future__ import annotations

import numpy as np

import popxl_core as popxl
from popxl_core import ops
from popxl_core.ops.scatter import gather_elements as popxl_gather_elements

from .misuse_cases_common import (
    F32,
    case,
    float_var,
    in_main,
    in_main_graph,
    int_var,
    io_ir,
    session_of,
)


# 5. bare KeyErrors and raw torch/numpy messages -------------------------------------------------
@case
def graph_calls_itself():
    ir = popxl.Ir()

    def body(a):
        return ops.call(popxl.gcg(), a)[0]

    return (
        lambda: ir.create_graph(body, popxl.TensorSpec((2,), popxl.float32)),
        ValueError,
        [r"body_subgraph\(0\)' -> '\S*body_subgraph\(0\)'", r"recursive", "themselves"],
    )


@case
def graphs_call_each_other():
    ir = popxl.Ir()
    spec = popxl.TensorSpec((2,), popxl.float32)
    inner = ir.create_graph(lambda a: a * 2.0, spec)
    outer = ir.create_graph(lambda a: ops.call(inner, a)[0], spec)

    def misuse():
        with inner:
            ops.call(outer, inner.inputs[0])

    return misuse, ValueError, [r"recursive", r"subgraph\(0\)' -> '\S*subgraph\(1\)' -> "]


@case
def call_graph_of_another_ir():
    other = popxl.Ir()
    g = other.create_graph(lambda a: a + 1.0, popxl.TensorSpec((2,), popxl.float32))
    ir = popxl.Ir()
    with ir.main_graph:
        x = float_var("x", (2,))

    def misuse():
        with ir.main_graph:
            ops.call(g, x)

    return misuse, ValueError, [r"belongs to Ir\[id=\d+\]", r"<lambda>_subgraph\(0\)'"]


@case
def op_on_tensor_of_another_ir():
    other = popxl.Ir()
    with other.main_graph:
        w = float_var("w_other")
    ir = popxl.Ir()
    with ir.main_graph:
        x = float_var("x")

    def misuse():
        with ir.main_graph:
            ops.add(x, w)

    return misuse, ValueError, [r"'w_other'", r"belongs to Ir\[id=\d+\]", r"in Ir\[id=\d+\]"]


@case
def get_tensor_data_of_another_ir():
    other = popxl.Ir()
    with other.main_graph:
        w = float_var("w_other")
    ir, _, _ = io_ir()
    session = session_of(ir)
    return (
        lambda: session.get_tensor_data(w),
        ValueError,
        [r"get_tensor_data", r"w_other", r"belongs to Ir\[id=\d+\]", r"Session\[Ir"],
    )


@case
def write_variable_data_of_another_ir():
    other = popxl.Ir()
    with other.main_graph:
        w = float_var("w_other")
    ir, _, _ = io_ir()
    session = session_of(ir)
    return (
        lambda: session.write_variable_data(w, np.zeros((2, 3), F32)),
        ValueError,
        [r"write_variables_data", r"w_other"],
    )


@case
def run_output_of_stream_never_stored():
    ir, xs, _ = io_ir()
    with ir.main_graph:
        zs = popxl.d2h_stream((2,), popxl.float32, "z")
    session = session_of(ir)
    with session:
        out = session.run({xs: np.ones(2, F32)})
    return lambda: out[zs], KeyError, [r"No output for stream 'z'", r"host_store", r"'y'"]


@case
def run_with_outputs_wrong_shape():
    ir, xs, ys = io_ir()
    session = session_of(ir)

    def misuse():
        with session:
            session.run_with_outputs({xs: np.ones(2, F32)}, {ys: np.zeros((3,), F32)})

    return misuse, ValueError, [r"stream 'y'", r"shape \(3,\)", r"expected \(2,\)"]


@case
def run_with_outputs_wrong_dtype():
    ir, xs, ys = io_ir()
    session = session_of(ir)

    def misuse():
        with session:
            session.run_with_outputs({xs: np.ones(2, F32)}, {ys: np.zeros((2,), np.float64)})

    return misuse, ValueError, [r"stream 'y'", r"float64", r"float32"]


@case
def run_with_outputs_strided_buffer():
    ir, xs, ys = io_ir()
    session = session_of(ir)

    def misuse():
        with session:
            session.run_with_outputs({xs: np.ones(2, F32)}, {ys: np.zeros(4, F32)[::2]})

    return misuse, ValueError, [r"stream 'y'", r"C-contiguous", r"lost"]


@case
def run_with_outputs_missing_buffer():
    ir, xs, _ = io_ir()
    session = session_of(ir)

    def misuse():
        with session:
            session.run_with_outputs({xs: np.ones(2, F32)}, {})

    return misuse, ValueError, [r"missing \['y'\]"]


@case
def run_nll_label_out_of_range():
    ir = popxl.Ir()
    with ir.main_graph:
        probs = popxl.variable(np.full((3, 4), 0.25, F32), name="probs")
        labels = popxl.variable(np.array([0, 7, 1], np.int32), name="labels")
        ops.host_store(popxl.d2h_stream((), popxl.float32, "loss"), ops.nll_loss(probs, labels))
    session = session_of(ir)

    def misuse():
        with session:
            session.run()

    return misuse, ValueError, [r"Nll op", r"'labels' \(3,\) int32", r"label 7", r"4 classes"]


@case
def run_input_stream_of_another_ir():
    _, other_xs, _ = io_ir()
    ir, xs, _ = io_ir()
    session = session_of(ir)

    def misuse():
        with session:
            session.run({xs: np.ones(2, F32), other_xs: np.ones(2, F32)})

    return misuse, ValueError, [r"Unexpected input: 'x'"]


@case
def op_gather_constant_index_out_of_range():
    ir = popxl.Ir()
    with ir.main_graph:
        table = popxl.variable(np.zeros((4, 2), F32), name="table")
        before = len(ir.main_graph.tensors)

    def misuse():
        with ir.main_graph:
            try:
                ops.gather(table, [1, 7])
            finally:
                assert len(ir.main_graph.tensors) == before

    return misuse, IndexError, [r"\[7\]", r"\[0, 4\)", r"'table' \(4, 2\)"]


@case
def op_gather_elements_constant_index_out_of_range():
    ir = popxl.Ir()
    with ir.main_graph:
        t = float_var("t", (2, 3))
        idx = popxl.constant(np.array([[0, 5, 1]], np.int32), name="ix")
    return (
        in_main(ir, lambda: popxl_gather_elements(t, idx, 1)),
        IndexError,
        [r"gather_elements", r"\[5\]", r"'ix'", r"'t' \(2, 3\)"],
    )


@case
def op_getitem_index_out_of_range():
    ir = popxl.Ir()
    with ir.main_graph:
        t = float_var("t", (2, 3))
    return in_main(ir, lambda: t[5]), IndexError, [r"'t'", r"5", r"size 2"]


@case
def op_reshape_negative_dim():
    ir = popxl.Ir()
    with ir.main_graph:
        t = float_var("t", (2, 3))
    return in_main(ir, lambda: ops.reshape(t, (-2, -3))), ValueError, [r"t \(2, 3\)", r"\(-2, -3\)"]


# integer overflow and value conversion --------------------------------------------------------
@case
def overflow_int8_scalar_operand():
    ir = popxl.Ir()
    with ir.main_graph:
        t = popxl.variable(np.array([1, 2], np.int8), name="small")
    return (
        in_main(ir, lambda: t + 300),
        ValueError,
        [r"'small' \(int8\)", r"300 does not fit int8", "44"],
    )


@case
def overflow_fraction_into_int_tensor():
    ir = popxl.Ir()
    with ir.main_graph:
        t = int_var("count")
    return (
        in_main(ir, lambda: ops.mul(t, 0.5)),
        ValueError,
        [r"'count' \(int32\)", r"0\.5", "become 0"],
    )


@case
def overflow_variable_int64_downcast():
    return in_main_graph(
        lambda: popxl.variable(2**40, name="big"),
        ValueError,
        [r"variable\('big'\)", r"1099511627776 does not fit int32"],
    )


@case
def overflow_constant_float16_inf():
    return in_main_graph(
        lambda: popxl.constant(70000.0, popxl.float16, name="h"),
        ValueError,
        [r"constant\('h'\)", r"70000\.0 does not fit float16", "inf"],
    )


@case
def overflow_constant_negative_unsigned():
    return in_main_graph(
        lambda: popxl.constant(-1, popxl.uint32, name="u"),
        ValueError,
        [r"constant\('u'\)", r"-1 does not fit uint32", "4294967295"],
    )


def _cast_run(values):
    ir = popxl.Ir()
    with ir.main_graph:
        f = popxl.variable(np.array(values, F32), name="f")
        ops.host_store(popxl.d2h_stream((len(values),), popxl.int32, "c"), ops.cast(f, popxl.int32))
    session = session_of(ir)

    def misuse():
        with session:
            session.run()

    return misuse


@case
def run_cast_float_out_of_int32_range():
    return (
        _cast_run([1.5, 3e9]),
        ValueError,
        [r"Cast op", r"'f' \(2,\) float32", r"3000000000\.0", r"int32 range"],
    )


@case
def run_cast_nan_to_int():
    return _cast_run([np.nan]), ValueError, [r"Cast op", r"nan", r"not finite"]


# misc user slips ---------------------------------------------------------------------------------
@case
def run_input_wrong_shape():
    ir, xs, _ = io_ir()
    session = session_of(ir)

    def misuse():
        with session:
            session.run({xs: np.ones(3, F32)})

    return misuse, ValueError, [r"stream 'x'", r"shape \(3,\)", r"\(2,\)"]


@case
def run_input_wrong_dtype():
    ir, xs, _ = io_ir()
    session = session_of(ir)

    def misuse():
        with session:
            session.run({xs: np.ones(2, np.int32)})

    return misuse, TypeError, [r"stream 'x'", r"int32", r"float32"]


@case
def run_missing_input():
    ir, _, _ = io_ir()
    session = session_of(ir)

    def misuse():
        with session:
            session.run({})

    return misuse, ValueError, [r"Missing input: 'x'"]


@case
def run_outside_session_context():
    ir, xs, _ = io_ir()
    session = session_of(ir)
    return lambda: session.run({xs: np.ones(2, F32)}), ValueError, [r"attached", r"with session"]


@case
def write_variable_data_wrong_dtype():
    ir = popxl.Ir()
    with ir.main_graph:
        w = float_var("w", (2,))
        ops.host_store(popxl.d2h_stream((2,), popxl.float32, "y"), w + 1.0)
    session = session_of(ir)
    return (
        lambda: session.write_variable_data(w, np.zeros(2, np.int32)),
        TypeError,
        [r"'w'", r"float32", r"int32"],
    )


@case
def variable_in_subgraph():
    ir = popxl.Ir()

    def build(a):
        return a + popxl.variable(1.0, name="bias")

    return (
        lambda: ir.create_graph(build, popxl.TensorSpec((2,), popxl.float32)),
        ValueError,
        [r"'bias'", r"main graph", r"subgraph"],
    )


@case
def op_shapes_do_not_broadcast():
    ir = popxl.Ir()
    with ir.main_graph:
        a, b = float_var("a", (2, 3)), float_var("b", (4,))
    return (
        in_main(ir, lambda: ops.add(a, b)),
        ValueError,
        [r"a \(2, 3\) float32", r"b \(4,\) float32"],
    )


@case
def host_store_shape_mismatch():
    ir = popxl.Ir()
    with ir.main_graph:
        t = float_var("t", (2, 3))
        ys = popxl.d2h_stream((3, 2), popxl.float32, "y")
    return (
        in_main(ir, lambda: ops.host_store(ys, t)),
        ValueError,
        [r"'t' \(2, 3\)", r"'y' \(3, 2\)"],
    )


@case
def len_of_scalar_tensor():
    ir = popxl.Ir()
    with ir.main_graph:
        t = popxl.variable(1.0, name="s")
    return lambda: len(t), ValueError, [r"len\(\) of a scalar tensor 's'"]
