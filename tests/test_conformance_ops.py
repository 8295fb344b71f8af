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
