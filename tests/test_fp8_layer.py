"""A float8 training step through addons.layers.LinearFP8 (popxl.addons' layer): forward and
`build_grad` with pow2-scaled float8 matmuls, the scales chosen on the device by each metric
(amax, mse, manual), then an SGD step, equal bit for bit to the same step computed in numpy from
the float8 host conversions (which tests/test_fp8.py checks against the formats' definition)."""

from __future__ import annotations

import numpy as np
import pytest

import addons
import popxl_core as popxl
from addons.layers.linear_fp8 import LinearFP8, truncated_normal
from popxl_core import fp8_utils, ops

F16 = np.float16
LR = 0.125  # a power of two: -lr * g is exact in float32, so no fused-multiply question


def _q(t, fmt, scale) -> np.ndarray:
    """``t`` cast to ``fmt`` at log2 scale ``scale`` and read back unscaled (float64)."""
    bits = fp8_utils.host_pow2scale_cast_to_fp8(t, fmt, int(scale))
    return fp8_utils.host_pow2scale_cast_from_fp8(bits, popxl.float64)


def _scale(metric: str, t: np.ndarray, fmt) -> int:
    if metric == "manual_scale":
        return 2
    if metric == "mse":
        return fp8_utils.host_fp8_mse_scale(t, fmt)[1]
    amax = np.float32(np.abs(t).max())
    return int(np.clip(np.floor(np.log2(np.float32(fp8_utils.fp8_max(fmt)) / amax)), -32, 31))


def _numpy_step(metric, x, w, b, dy):
    f143, f152 = popxl.float8_143, popxl.float8_152
    sw, sx = _scale(metric, w, f143), _scale(metric, x, f143)
    xq, wq = _q(x, f143, sx), _q(w, f143, sw)
    y = (xq @ wq * 2.0 ** (-sw - sx)).astype(F16) + b
    sg = int(np.clip(_scale(metric, dy, f152) - 3, -31, 31))
    gq = _q(dy, f152, sg)
    dw = (gq.T @ xq * 2.0 ** (-sx - sg)).astype(F16).T
    db = dy.astype(np.float32).sum(0).astype(F16)
    new_w = (w.astype(np.float32) + np.float32(-LR) * dw.astype(np.float32)).astype(F16)
    new_b = (b.astype(np.float32) + np.float32(-LR) * db.astype(np.float32)).astype(F16)
    return y, new_w, new_b


class _Net(addons.Module):
    """LinearFP8 called as a submodule: autodiff then uses its `build_grad` (as in
    popxl.addons' MNIST float8 test)."""

    def __init__(self, out_features: int, metric: str):
        super().__init__()
        self.layer = LinearFP8(out_features, scale_metric=metric, scale=2)

    def build(self, x):
        (y,) = self.call_module(self.layer, name="linear")(x)
        return y


def _device_step(metric, x, w, b, dy):
    ir = popxl.Ir()
    with ir.main_graph, popxl.in_sequence():
        xv = popxl.variable(x, name="x")
        factories, fwd = _Net(w.shape[1], metric).create_graph(xv)
        bwd = addons.autodiff(fwd)
        params = factories.init()
        site = fwd.bind(params).call_with_info(xv)
        info = bwd.grad_graph_info
        grad_site = bwd.call_with_info(popxl.constant(dy), args=info.inputs_dict(site))
        grads = info.fwd_parent_ins_to_grad_parent_outs(site, grad_site)
        for p in params.tensors:
            ops.scaled_add_(p, grads[p], b=-LR)
        y_out = popxl.d2h_stream(site.outputs[0].shape, popxl.float16, "y")
        ops.host_store(y_out, site.outputs[0])
    with popxl.Session(ir, "ipu_model") as sess:
        sess.write_variables_data({params.linear.weight: w, params.linear.bias: b})
        y = sess.run()[y_out]
    return y, sess.get_tensor_data(params.linear.weight), sess.get_tensor_data(params.linear.bias)


@pytest.mark.parametrize("metric", ["amax", "mse", "manual_scale"])
def test_linear_fp8_training_step_bit_exact(metric):
    rng = np.random.default_rng(5)
    x = rng.uniform(-3, 3, (4, 6)).astype(F16)
    w = rng.uniform(-0.5, 0.5, (6, 3)).astype(F16)
    b = rng.uniform(-0.1, 0.1, 3).astype(F16)
    dy = rng.uniform(-0.02, 0.02, (4, 3)).astype(F16)
    got = _device_step(metric, x, w, b, dy)
    want = _numpy_step(metric, x, w, b, dy)
    assert not np.array_equal(got[1], w)  # the step moved the weight
    for g, e in zip(got, want):
        assert g.dtype == F16
        np.testing.assert_array_equal(g, e)


def test_fp8_mse_scale_op_equals_the_host_estimate():
    from addons.ops.fp8_mse_scale import fp8_mse_scale

    src = np.random.default_rng(1).normal(0, 30, 200).astype(np.float32)
    ir = popxl.Ir()
    with ir.main_graph:
        s = fp8_mse_scale(popxl.variable(src), popxl.float8_152)
        out = popxl.d2h_stream(s.shape, s.dtype)
        ops.host_store(out, s)
        with pytest.raises(TypeError, match="float8_143 or float8_152"):
            fp8_mse_scale(popxl.variable(src), popxl.float16)
    with popxl.Session(ir, "ipu_model") as sess:
        got = sess.run()[out]
    assert got == fp8_utils.host_fp8_mse_scale(src, popxl.float8_152)[1] and got.dtype == np.int32


def test_truncated_normal_and_bad_metric():
    np.random.seed(0)
    w = truncated_normal((100, 50), scale=0.5)
    assert np.abs(w).max() <= 1.0 and w.std() > 0.3
    with pytest.raises(ValueError, match="scale_metric option max is not available"):
        LinearFP8(3, scale_metric="max")
