"""Op inputs PopXL takes that the project refused (Graphcore's test_session_ctxtmgr and
test_variable_location): a float accumulator with an integer X, scaled_add of integer tensors
with PopXL's default float scales."""

from __future__ import annotations

import numpy as np
import pytest

import popxl_core as popxl
from popxl_core import ops


def _run(ir, *variables):
    with popxl.Session(ir, "ipu_model") as sess:
        sess.run()
    return [sess.get_tensor_data(v) for v in variables]


def test_float_accumulator_takes_an_integer_x():
    ir = popxl.Ir()
    with ir.main_graph:
        w = popxl.variable(np.array(2.0, np.float32))
        ops.var_updates.accumulate_(w, popxl.constant(2))  # int32 X
        h = popxl.variable(np.full(3, 0.5, np.float16))
        ops.var_updates.accumulate_(h, popxl.constant(np.arange(3, dtype=np.int32)), 0.5)
        with pytest.raises(TypeError, match="X must be a float or integer tensor, got bool"):
            ops.var_updates.accumulate_(w, popxl.constant(True))
    got_w, got_h = _run(ir, w, h)
    assert got_w == 4.0 and got_w.dtype == np.float32
    np.testing.assert_array_equal(got_h, np.array([0.5, 1.0, 1.5], np.float16))


def test_integer_scaled_add_with_whole_float_scales():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.array([1, 2], np.int32))
        y = popxl.variable(np.array([3, 4], np.int32))
        ops.scaled_add_(x, y)  # a=1.0, b=1.0
        z = popxl.variable(np.array([10, 20], np.int32))
        s = ops.scaled_add(z, y, 2.0, -3.0)
        z2 = popxl.variable(np.zeros(2, np.int32))
        ops.var_updates.copy_var_update_(z2, s)
    got_x, got_z2 = _run(ir, x, z2)
    np.testing.assert_array_equal(got_x, [4, 6])
    np.testing.assert_array_equal(got_z2, [11, 28])
    assert got_x.dtype == got_z2.dtype == np.int32


def test_group_quantize_numpy_defaults_and_non_finite():
    """popxl.addons' own tests call the numpy twins without ``dim`` (the last axis) and expect
    a ValueError for non-finite data."""
    from addons.ops.group_quantize_decompress import (
        group_quantize_compress_numpy,
        group_quantize_decompress_numpy,
    )

    w = np.linspace(-1, 1, 32, dtype=np.float16).reshape(2, 16)
    packed, scale, bias = group_quantize_compress_numpy(w, 8)
    for got, want in zip((packed, scale, bias), group_quantize_compress_numpy(w, 8, -1)):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(
        group_quantize_decompress_numpy(packed, scale, bias),
        group_quantize_decompress_numpy(packed, scale, bias, -1),
    )
    w[0, 3] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        group_quantize_compress_numpy(w, 8)
