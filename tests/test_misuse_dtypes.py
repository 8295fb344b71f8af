"""Dtype rules and integer semantics: float-only ops refuse integers (every row of the op table
that declares it), integer arithmetic and integer-to-integer casts wrap like the IPU's, and
float-to-int casts truncate toward zero when the value fits."""

from __future__ import annotations

import numpy as np
import pytest

import popxl_core as popxl
from popxl_core import ops
from popxl_core.ops._dtype_rules import float_only_inputs
from popxl_core.ops.registry import all_opdefs

FLOAT_ONLY = sorted(n for n, d in all_opdefs().items() if float_only_inputs(d.infer))


def test_the_float_only_ops_are_declared():
    for name in (
        "Sqrt",
        "Exp",
        "Log",
        "Sigmoid",
        "Gelu",
        "GeluGrad",
        "Relu",
        "Swish",
        "Tanh",
        "GroupNormalization",
        "BatchNormalization",
    ):
        assert name in FLOAT_ONLY


@pytest.mark.parametrize("name", FLOAT_ONLY)
def test_float_only_row_refuses_integer_inputs(name):
    opdef = all_opdefs()[name]
    sample = opdef.samples()[0]
    ints = [
        np.zeros(np.shape(a), np.int32)
        if np.issubdtype(np.asarray(a).dtype, np.floating)
        else np.asarray(a)
        for a in sample.inputs
    ]
    ir = popxl.Ir()
    specs = [popxl.TensorSpec(a.shape, popxl.dtype.as_dtype(a)) for a in ints]
    with pytest.raises(TypeError, match=r"floating point.*int32.*ops\.cast"):
        ir.create_graph(lambda *xs: sample.build(*xs), *specs)


def _run(build, *arrays):
    """Outputs of ``build`` on ``arrays`` (variables) through one Session run."""
    ir = popxl.Ir()
    with ir.main_graph:
        xs = [popxl.variable(a, name=f"x{i}", downcast=False) for i, a in enumerate(arrays)]
        out = build(*xs)
        stream = popxl.d2h_stream(out.shape, out.dtype, "out")
        ops.host_store(stream, out)
    session = popxl.Session(ir, "ipu_hw")
    with session:
        return session.run()[stream]


def test_int32_addition_wraps_like_the_ipu():
    big = np.array([2**31 - 1, -(2**31)], np.int32)
    got = _run(lambda x: x + np.int32(1), big)
    with np.errstate(over="ignore"):
        want = big + np.int32(1)  # two's complement wrap: [-2**31, -2**31 + 1]
    np.testing.assert_array_equal(got, want)
    assert got[0] == -(2**31)


def test_int32_multiplication_wraps():
    x = np.array([65536, 3], np.int32)
    got = _run(lambda a: a * a, x)
    np.testing.assert_array_equal(got, np.array([0, 9], np.int32))  # 2**32 wraps to 0


def test_integer_narrowing_cast_wraps():
    x = np.array([300, -129, 127], np.int32)
    got = _run(lambda a: ops.cast(a, popxl.int8), x)
    np.testing.assert_array_equal(got, x.astype(np.int8))  # [44, 127, 127]
    assert got.tolist() == [44, 127, 127]


def test_float_to_int_cast_truncates_toward_zero_in_range():
    x = np.array([2.7, -2.7, 2147483520.0, -2147483648.0], np.float32)
    got = _run(lambda a: ops.cast(a, popxl.int32), x)
    assert got.tolist() == [2, -2, 2147483520, -2147483648]


def test_host_values_that_fit_are_accepted():
    ir = popxl.Ir()
    with ir.main_graph:
        t = popxl.variable(np.array([1, 2], np.int8), name="small")
        assert (t + 100).dtype is popxl.int8
        assert popxl.constant(3.0, popxl.int32).dtype is popxl.int32
        assert popxl.constant(2**31 - 1, popxl.int32)._data == 2**31 - 1
        assert popxl.constant(65504.0, popxl.float16)._data == 65504.0


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
def test_implicit_float64_downcast_follows_popxl_explicit_dtype_refuses():
    """PopXL's documented downcast (no dtype given) turns an out-of-range float64 into inf
    silently, and Graphcore's own examples rely on it (``np.ndarray(shape)`` garbage data);
    we follow it there. With an explicit dtype the same overflow is refused."""
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(np.array([1e300, 1.0]), name="wide")
        assert v.dtype is popxl.float32 and np.isinf(v._data[0])
        with pytest.raises(ValueError, match=r"variable\('narrow'\).*1e\+300 does not fit"):
            popxl.variable(np.array([1e300]), popxl.float32, name="narrow")
        with pytest.raises(ValueError, match=r"variable\('count'\).*does not fit int32"):
            popxl.variable(np.array([2**40, 1]), name="count")  # an int64 that would wrap
