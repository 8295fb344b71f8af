"""A training program whose weight variable is float8 itself (stored as float8_143 bits at
log2 scale 3, no float32 master copy): pow2-scaled float8 matmuls forward and backward, the
update decoded to float16 and encoded back into the variable each step; bit for bit against the
formats' definition (tests/test_fp8.py's `_table` / `_encode`)."""

from __future__ import annotations

import numpy as np

import popxl_core as popxl
from popxl_core import ops
from tests.test_fp8 import _encode, _table

F143, F152 = popxl.float8_143, popxl.float8_152
SX, SW, SG, LR, STEPS = 2, 3, 6, 0.125, 3  # LR a power of two: dw * LR is exact in float16


def _step_graph(ir, w_shape, x_shape):
    g = ir.create_empty_graph("step")
    with g, popxl.in_sequence():
        w8 = popxl.graph_input(w_shape, F143, "w", by_ref=True)
        x8 = ops.pow2scale_cast_to_fp8(popxl.graph_input(x_shape, popxl.float32, "x"), SX, F143)
        y = ops.matmul_pow2scaled(x8, w8, -SX - SW)  # float16; dL/dy = y for L = sum(y*y)/2
        g8 = ops.pow2scale_cast_to_fp8(y, SG, F152)
        dw = ops.matmul_pow2scaled(g8.T, x8, -SG - SX).T
        w16 = ops.pow2scale_cast_from_fp8(w8, -SW, popxl.float16)
        new = ops.pow2scale_cast_to_fp8(w16 - dw * LR, SW, F143)
        ops.var_updates.copy_var_update_(w8, new)
    return g


def _device(x, w0):
    ir = popxl.Ir()
    with ir.main_graph, popxl.in_sequence():
        w = popxl.variable(w0, F143, name="w", log2_scale=SW)
        xv = popxl.variable(x, name="x")
        ops.repeat(_step_graph(ir, w0.shape, x.shape), STEPS, w, xv)
    with popxl.Session(ir, "ipu_model") as sess:
        sess.run()
        return sess.get_tensor_data(w)


def _numpy(x, w0):
    t143, t152 = _table(F143), _table(F152)
    bits = _encode(w0.astype(np.float64) * 2.0**SW, F143)
    xq = t143[_encode(x.astype(np.float64) * 2.0**SX, F143)]
    for _ in range(STEPS):
        y = (xq @ t143[bits] * 2.0 ** (-SX - SW)).astype(np.float16)
        gq = t152[_encode(y.astype(np.float64) * 2.0**SG, F152)]
        dw = (gq.T @ xq * 2.0 ** (-SG - SX)).astype(np.float16).T
        w16 = (t143[bits] * 2.0**-SW).astype(np.float16)
        bits = _encode((w16 - dw * np.float16(LR)).astype(np.float64) * 2.0**SW, F143)
    return bits


def test_float8_weight_variable_trained_bit_exact():
    rng = np.random.default_rng(11)
    x = rng.uniform(-2, 2, (4, 6)).astype(np.float32)
    w0 = rng.uniform(-1, 1, (6, 3)).astype(np.float32)
    got = _device(x, w0)
    want = _numpy(x, w0)
    assert got.dtype == F143.as_numpy() and got.shape == w0.shape
    assert not np.array_equal(want, _encode(w0.astype(np.float64) * 2.0**SW, F143))  # it moved
    np.testing.assert_array_equal(got.view(np.uint8), want)
