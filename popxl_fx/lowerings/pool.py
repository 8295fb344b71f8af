"""Max/average pooling (padding, ceil_mode, count_include_pad, dilation for max) and adaptive
pooling to any output size.

Adaptive average pooling is one AdaptiveAveragePool op (torch's kernel); adaptive max pooling
with an output size that divides the input is one max pool, otherwise a max over each bin's
slice (torch's bins: [floor(i*n/m), ceil((i+1)*n/m))).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import popxl_core as popxl
from popxl_core import ops
from popxl_core.ops.pool import AVERAGE_POOL
from popxl_core.ops.pool_indices import max_pool2d_with_indices, torch_applies_pads
from popxl_core.ops.registry import create_op

from ..lowering import lowers
from ._common import tuple_of
from .aten_kernels import lower_torch_function

__all__ = ["adaptive_avg_pool", "adaptive_max_pool", "avg_pool", "max_pool"]


def _rank(x: popxl.Tensor, r: int, what: str) -> None:
    if x.rank != r + 2:
        raise ValueError(
            f"{what}: expected a batched input of rank {r + 2}, got "
            f"{tuple(x.shape)} (add a batch dim with unsqueeze(0))"
        )


def _params(kernel_size, stride, padding, r: int):
    k = tuple_of(kernel_size, r)
    s = (
        k
        if stride is None or (isinstance(stride, Sequence) and not stride)
        else tuple_of(stride, r)
    )
    p = tuple_of(padding, r)
    return k, s, p + p


def max_pool(
    x,
    kernel_size,
    stride=None,
    padding=0,
    dilation=1,
    ceil_mode=False,
    return_indices=False,
    r: int = 2,
) -> popxl.Tensor:
    """torch's max_pool{r}d (the stride defaults to the kernel size)."""
    if return_indices:
        raise NotImplementedError("max_pool with return_indices=True is not supported")
    _rank(x, r, f"max_pool{r}d")
    k, s, p = _params(kernel_size, stride, padding, r)
    d = tuple_of(dilation, r)
    # eager's pair where torch pads itself: the gradient reads the forward's indices
    if r == 2 and torch_applies_pads(k, p, d):
        return max_pool2d_with_indices(x, k, s, p, d, bool(ceil_mode))
    return ops.max_pool(x, k, s, p, dilation=d, ceil_mode=bool(ceil_mode))


def avg_pool(
    x,
    kernel_size,
    stride=None,
    padding=0,
    ceil_mode=False,
    count_include_pad=True,
    divisor_override=None,
    r: int = 2,
) -> popxl.Tensor:
    """torch's avg_pool{r}d (count_include_pad defaults to True, unlike popxl)."""
    _rank(x, r, f"avg_pool{r}d")
    k, s, p = _params(kernel_size, stride, padding, r)
    if divisor_override:
        summed = create_op(
            AVERAGE_POOL,
            [x],
            {
                "kernel": k,
                "strides": s,
                "pads": p,
                "ceil_mode": bool(ceil_mode),
                "count_include_pad": True,
            },
        )[0]
        return summed * (float(np.prod(k)) / float(divisor_override))
    attrs = {
        "kernel": k,
        "strides": s,
        "pads": p,
        "ceil_mode": bool(ceil_mode),
        "count_include_pad": bool(count_include_pad),
    }
    return create_op(AVERAGE_POOL, [x], attrs)[0]


def _pool_fn(fn, r):
    def lower(ctx, x, *args, **kwargs):
        return fn(x, *args, r=r, **kwargs)

    return lower


for _r in (1, 2, 3):
    lowers(getattr(F, f"max_pool{_r}d"), getattr(torch, f"max_pool{_r}d"))(_pool_fn(max_pool, _r))
    # the functions run torch's kernels (ceil_mode, divisor_override, padding as eager)
    lowers(
        getattr(F, f"avg_pool{_r}d"),
        getattr(torch, f"avg_pool{_r}d", None) or getattr(F, f"avg_pool{_r}d"),
    )(lower_torch_function)


def _max_module(ctx, m, x):
    r = int(type(m).__name__[-2])
    return max_pool(
        x, m.kernel_size, m.stride, m.padding, m.dilation, m.ceil_mode, m.return_indices, r=r
    )


def _avg_module(ctx, m, x):
    r = int(type(m).__name__[-2])
    extra = {} if r == 1 else {"divisor_override": m.divisor_override}
    return avg_pool(
        x, m.kernel_size, m.stride, m.padding, m.ceil_mode, m.count_include_pad, r=r, **extra
    )


lowers(nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d)(_max_module)
lowers(nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d)(_avg_module)


# adaptive pooling ----------------------------------------------------------------------------
def _bins(n: int, m: int) -> list[tuple[int, int]]:
    return [(i * n // m, -(-(i + 1) * n // m)) for i in range(m)]


def _out_sizes(x, output_size, r: int) -> tuple[int, ...]:
    sizes = (
        [output_size] * r
        if isinstance(output_size, int) or output_size is None
        else list(output_size)
    )
    if len(sizes) == 1 and r > 1:
        sizes = sizes * r
    return tuple(x.shape[x.rank - r + i] if s is None else int(s) for i, s in enumerate(sizes))


def _along(x, axis: int, fn):
    """Apply ``fn`` (acting on the last axis) to ``axis`` of ``x``."""
    if axis == x.rank - 1:
        return fn(x)
    perm = list(range(x.rank))
    perm[axis], perm[-1] = perm[-1], perm[axis]
    return ops.transpose(fn(ops.transpose(x, perm)), perm)


def _adaptive(x, output_size, r: int, kind: str) -> popxl.Tensor:
    if x.rank not in (r + 1, r + 2):
        raise ValueError(
            f"adaptive_{kind}_pool{r}d: input {tuple(x.shape)} must have rank {r + 1} or {r + 2}"
        )
    out = _out_sizes(x, output_size, r)
    ins = tuple(x.shape[x.rank - r :])
    if kind == "avg":  # torch's own kernels (a mean for 1x1, overlapping bins in its order)
        if x.rank == r + 1:
            return ops.squeeze(ops.adaptive_average_pool(ops.unsqueeze(x, 0), out), 0)
        return ops.adaptive_average_pool(x, out)
    if all(o == 1 for o in out):  # global pooling
        return ops.max(x, tuple(range(x.rank - r, x.rank)), keepdims=True)
    if all(n % m == 0 for n, m in zip(ins, out)) and x.rank == r + 2:
        k = tuple(n // m for n, m in zip(ins, out))
        return ops.max_pool(x, k, k)
    for i, (n, m) in enumerate(zip(ins, out)):
        axis = x.rank - r + i
        if n != m:
            x = _along(x, axis, _max_bins(n, m))
    return x


def _max_bins(n: int, m: int):
    def fn(t):
        parts = [
            ops.max(ops.slice(t, lo, hi, axis=t.rank - 1), t.rank - 1, keepdims=True)
            for lo, hi in _bins(n, m)
        ]
        return ops.concat(parts, t.rank - 1)

    return fn


def adaptive_avg_pool(x: popxl.Tensor, output_size, r: int = 2) -> popxl.Tensor:
    return _adaptive(x, output_size, r, "avg")


def adaptive_max_pool(
    x: popxl.Tensor, output_size, return_indices: bool = False, r: int = 2
) -> popxl.Tensor:
    if return_indices:
        raise NotImplementedError("adaptive_max_pool with return_indices=True is not supported")
    return _adaptive(x, output_size, r, "max")


for _r in (1, 2, 3):
    lowers(getattr(F, f"adaptive_avg_pool{_r}d"))(_pool_fn(adaptive_avg_pool, _r))
    lowers(
        getattr(F, f"adaptive_max_pool{_r}d"),
        getattr(F, f"adaptive_max_pool{_r}d_with_indices"),
    )(lower_torch_function)


@lowers(nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d)
def _adaptive_avg_module(ctx, m, x):
    return adaptive_avg_pool(x, m.output_size, r=int(type(m).__name__[-2]))


@lowers(nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d, nn.AdaptiveMaxPool3d)
def _adaptive_max_module(ctx, m, x):
    return adaptive_max_pool(x, m.output_size, m.return_indices, r=int(type(m).__name__[-2]))
