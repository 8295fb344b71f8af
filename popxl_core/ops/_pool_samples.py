"""Test samples of the pooling ops (kept apart from pool.py to keep it small): references are
torch's own pools, with autograd for the gradient ops.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import _spatial as sp
from ._utils import rand
from .registry import Sample, create_op

__all__ = ["avg_samples", "grad_op_samples", "max_samples"]


def _ref_avg(kernel, strides, pads, ceil_mode=False):
    """torch's own average pool where it can express the pads; else sum / count by hand."""
    r = len(kernel)
    if sp.is_symmetric(pads):
        pool = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}[r]
        return lambda x: pool(x, kernel, strides, pads[:r], ceil_mode, count_include_pad=False)
    unfold = torch.nn.Unfold(kernel, stride=strides)

    def ref(x):  # 2-D only
        xp = F.pad(x, sp.torch_pads(pads))
        ones = F.pad(torch.ones_like(x), sp.torch_pads(pads))
        n, c = x.shape[:2]
        out = [
            (x.shape[2 + i] + pads[i] + pads[r + i] - kernel[i]) // strides[i] + 1 for i in range(r)
        ]
        sums = unfold(xp.reshape(n * c, 1, *xp.shape[2:])).sum(1)
        counts = unfold(ones.reshape(n * c, 1, *xp.shape[2:])).sum(1)
        return (sums / counts).reshape(n, c, *out)

    return ref


def avg_samples():
    from .pool import AVERAGE_POOL, average_pool  # pool.py registers these samples

    S = Sample
    return [
        S(
            [rand(2, 3, 6, 7, seed=110)],
            lambda x: average_pool(x, (2, 3)),
            _ref_avg((2, 3), (1, 1), (0,) * 4),
            name="default_stride_1",
        ),
        S(
            [rand(2, 3, 6, 7, seed=116)],
            lambda x: average_pool(x, (2, 3), (2, 3)),
            _ref_avg((2, 3), (2, 3), (0,) * 4),
            name="stride_kernel",
        ),
        S(
            [rand(2, 3, 7, 7, seed=111)],
            lambda x: average_pool(x, (3, 3), (2, 2), (1, 1, 1, 1)),
            _ref_avg((3, 3), (2, 2), (1, 1, 1, 1)),
            name="padded",
        ),
        S(
            [rand(1, 2, 6, 5, seed=112)],
            lambda x: average_pool(x, (3, 2), (2, 1), (1, 0, 2, 1)),
            _ref_avg((3, 2), (2, 1), (1, 0, 2, 1)),
            name="asym",
        ),
        S(
            [rand(2, 2, 8, seed=113)],
            lambda x: average_pool(x, (3,), (2,), (1, 1), ceil_mode=True),
            _ref_avg((3,), (2,), (1, 1), True),
            name="1d_ceil",
        ),
        S(
            [rand(1, 2, 4, 5, 6, seed=114)],
            lambda x: average_pool(x, (2, 2, 3)),
            _ref_avg((2, 2, 3), (1, 1, 1), (0,) * 6),
            name="3d",
        ),
        S(
            [rand(2, 2, 5, 6, seed=115)],
            lambda x: create_op(
                AVERAGE_POOL,
                [x],
                {
                    "kernel": (3, 3),
                    "strides": (2, 2),
                    "pads": (1,) * 4,
                    "ceil_mode": True,
                    "count_include_pad": True,
                },
            )[0],
            lambda x: F.avg_pool2d(x, 3, 2, 1, True, count_include_pad=True),
            name="count_include_pad_ceil",
        ),
    ]


def max_samples():
    from .pool import max_pool

    S = Sample
    return [
        S(
            [rand(2, 3, 6, 7, seed=120)],
            lambda x: max_pool(x, (2, 2)),
            lambda x: F.max_pool2d(x, 2, 1),
            name="default_stride_1",
        ),
        S(
            [rand(2, 3, 6, 7, seed=125)],
            lambda x: max_pool(x, (2, 2), (2, 2)),
            lambda x: F.max_pool2d(x, 2),
            name="stride_kernel",
        ),
        S(
            [rand(2, 3, 9, 8, seed=121)],
            lambda x: max_pool(x, (3, 2), (2, 1), (1, 1, 1, 1), dilation=(2, 1)),
            lambda x: F.max_pool2d(x, (3, 2), (2, 1), 1, (2, 1)),
            name="dilated",
        ),
        S(
            [rand(1, 2, 7, seed=122)],
            lambda x: max_pool(x, (3,), (2,), (0, 2)),
            lambda x: F.max_pool1d(F.pad(x, (0, 2), value=float("-inf")), 3, 2),
            name="1d_asym",
        ),
        S(
            [rand(1, 2, 7, 6, seed=123)],
            lambda x: max_pool(x, (2, 2), (2, 2), ceil_mode=True),
            lambda x: F.max_pool2d(x, 2, ceil_mode=True),
            name="ceil",
        ),
        S(
            [rand(1, 2, 5, 5, seed=124)],
            lambda x: max_pool(x, (3, 3), (3, 3), auto_pad="same_upper"),
            lambda x: F.max_pool2d(F.pad(x, (0, 1, 0, 1), value=float("-inf")), 3),
            name="same_upper",
        ),
    ]


def grad_op_samples(which):
    from .pool import AVERAGE_POOL_GRAD, MAX_POOL_GRAD, _avg_kernel, _max_kernel

    cases = [
        (rand(2, 3, 7, 6, seed=130), (3, 2), (2, 2), (1, 0, 1, 1), False),
        (rand(1, 2, 9, seed=131), (2,), (3,), (0, 1), True),
        # overlapping windows, pads torch applies itself (MaxPoolGrad's native path)
        (rand(2, 3, 6, 6, seed=132), (3, 3), (2, 2), (1, 1, 1, 1), True),
    ]
    out = []
    for i, (x, k, s, p, ceil) in enumerate(cases):
        attrs = {"kernel": k, "strides": s, "pads": p, "ceil_mode": ceil}
        if which == "max":
            attrs["dilation"] = (1,) * len(k)
        fwd = _max_kernel if which == "max" else _avg_kernel
        y_shape = fwd(torch.from_numpy(x), **attrs).shape
        dy = rand(*y_shape, seed=140 + i)

        def build(dy, x, attrs=attrs):
            if which == "max":
                return create_op(MAX_POOL_GRAD, [dy, x], attrs)[0]
            return create_op(AVERAGE_POOL_GRAD, [dy], {"input_shape": x.shape, **attrs})[0]

        def ref(dy, x, fwd=fwd, attrs=attrs):
            x = x.detach().requires_grad_()
            with torch.enable_grad():
                return torch.autograd.grad(fwd(x, **attrs), x, dy)[0]

        out.append(Sample([dy, x], build, ref, grad=False, name=f"case{i}"))
    return out
