"""Op behaviours where PopXL differs from torch (issue 9): each checked on the simulator
against an eager torch / numpy reference written from PopXL's documented semantics."""

from __future__ import annotations

from typing import Callable, List

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import popxl_core as popxl
from popxl_core import ops


def run_main(build: Callable[..., object], *arrays: np.ndarray) -> List[np.ndarray]:
    """Build ``build(*variables)`` in a main graph, run it once, return every output."""
    ir = popxl.Ir()
    with ir.main_graph:
        xs = [popxl.variable(a, popxl.dtype.as_dtype(a), downcast=False) for a in arrays]
        outs = build(*xs)
        outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
        streams = []
        for t in outs:
            s = popxl.d2h_stream(t.shape, t.dtype)
            ops.host_store(s, t)
            streams.append(s)
    with popxl.Session(ir, "ipu_model") as session:
        res = session.run({})
    return [res[s] for s in streams]


def _rand(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random(shape, dtype=np.float32)


# pooling: PopXL's stride defaults to 1, where torch's defaults to the kernel size ---------
def test_max_pool_default_stride_is_one():
    x = _rand(2, 3, 9, 8)
    (y,) = run_main(lambda t: ops.max_pool(t, (3, 2)), x)
    ref = F.max_pool2d(torch.from_numpy(x), (3, 2), stride=1).numpy()
    assert y.shape == (2, 3, 7, 7)
    np.testing.assert_array_equal(y, ref)  # a max selects, so exact


def test_average_pool_default_stride_is_one_1d_and_3d():
    x1, x3 = _rand(2, 3, 10, seed=1), _rand(1, 2, 4, 5, 6, seed=2)
    y1, y3 = run_main(
        lambda a, b: (ops.average_pool(a, (4,)), ops.average_pool(b, (2, 3, 2))), x1, x3
    )
    ref1 = F.avg_pool1d(torch.from_numpy(x1), 4, 1).numpy()
    ref3 = F.avg_pool3d(torch.from_numpy(x3), (2, 3, 2), 1).numpy()
    assert y1.shape == (2, 3, 7) and y3.shape == (1, 2, 3, 3, 5)
    # float32 sums of <= 12 values then one division: a few ulps
    np.testing.assert_allclose(y1, ref1, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(y3, ref3, rtol=1e-6, atol=1e-7)


# gather / tied_gather: out-of-range indices never raise ----------------------------------
@pytest.mark.filterwarnings("ignore::popxl_core.ops.gather.GatherIndexWarning")
def test_gather_and_tied_gather_out_of_range_give_zero_rows():
    w = _rand(4, 6, seed=3)
    idx = np.array([3, 2**31 - 1, 0, 9], np.uint32)  # unsigned, two out of range
    outs = run_main(
        lambda t, i: [
            f(t, i, zero_OOR=z) for f in (ops.gather, ops.tied_gather) for z in (True, False)
        ],
        w,
        idx,
    )
    ref = np.stack([w[3], np.zeros(6, np.float32), w[0], np.zeros(6, np.float32)])
    for out in outs:
        np.testing.assert_array_equal(out, ref)  # a copy: exact


# subsample: an int stride and short stride lists (trailing axes keep stride 1) ------------
def test_subsample_int_and_short_strides():
    x = np.arange(7 * 5 * 4, dtype=np.int32).reshape(7, 5, 4)
    a, b = run_main(lambda t: (ops.subsample(t, 3), ops.subsample(t, [2, 2])), x)
    np.testing.assert_array_equal(a, x[::3])
    np.testing.assert_array_equal(b, x[::2, ::2])


def test_subsample_rejects_more_strides_than_axes():
    ir = popxl.Ir()
    with ir.main_graph:
        t = popxl.variable(np.zeros((4, 4), np.float32), name="w")
        with pytest.raises(ValueError, match=r"3 strides \[1, 1, 1\].*'w'"):
            ops.subsample(t, [1, 1, 1])


# uint32 arithmetic (seed + 1): computed exactly, wrapping modulo 2**32 like the IPU -------
def test_uint32_arithmetic_wraps():
    a = np.array([0, 7, 2**32 - 1, 2**31], np.uint32)
    s, p, d = run_main(lambda t: (t + 1, t * 3, t - 8), a)
    wide = a.astype(np.int64)
    np.testing.assert_array_equal(s, ((wide + 1) % 2**32).astype(np.uint32))
    np.testing.assert_array_equal(p, ((wide * 3) % 2**32).astype(np.uint32))
    np.testing.assert_array_equal(d, ((wide - 8) % 2**32).astype(np.uint32))
    assert s.dtype == p.dtype == d.dtype == np.uint32


def test_dropout_with_seed_plus_one_runs_and_differs_from_seed():
    x = np.ones((64,), np.float32)
    seed = popxl.create_seeds(1984)
    y0, y1 = run_main(
        lambda t, s: (ops.dropout(t, s, p=0.5), ops.dropout(t, s + 1, p=0.5)), x, seed
    )
    assert set(np.unique(y0)) <= {0.0, 2.0} and set(np.unique(y1)) <= {0.0, 2.0}
    assert not np.array_equal(y0, y1)


# accumulate_ on integer tensors: exact integer arithmetic --------------------------------
def test_accumulate_integer_tensors_exactly():
    t = np.array([[2**30, -5], [7, 0]], np.int32)
    x = np.array([[3, 4], [-7, 2**29]], np.int32)

    @popxl.in_sequence()  # two unordered writes of a: refused as ambiguous, as in PopXL
    def build(a, b):
        ops.var_updates.accumulate_(a, b)
        return ops.var_updates.accumulate_(a, b, 2.0)  # stored after both writes

    (out,) = run_main(build, t, x)
    np.testing.assert_array_equal(out, t + 3 * x)


def test_accumulate_integer_rejects_fractional_factor_and_mixed_dtypes():
    ir = popxl.Ir()
    with ir.main_graph:
        t = popxl.variable(np.zeros(3, np.int32), name="counts")
        f = popxl.variable(np.zeros(3, np.float32), name="grads")
        with pytest.raises(ValueError, match="whole number"):
            ops.var_updates.accumulate_(t, t, 0.5)
        with pytest.raises(TypeError, match="X is float32.*int32"):
            ops.var_updates.accumulate_(t, f)
        with pytest.raises(TypeError, match="'moving_average' needs a floating point t"):
            ops.var_updates.accumulate_moving_average_(t, t, 0.9)
