"""Reductions (sum/mean/prod/max/min/amax/amin/argmax/argmin/var/std/norm/logsumexp/all/any),
softmax/log_softmax, cumsum and cumprod, with torch's argument conventions (dim=None reduces all,
max/min with a dim return (values, indices), var/std take unbiased or correction)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import popxl_core as popxl
from popxl_core import ops

from ..lowering import lowers
from ._common import const, is_t, norm_dim, norm_dims, promote
from .aten_kernels import lower_torch_function, torch_call, torch_kernel_when

__all__ = ["softmax", "var"]


def _float(x):
    return x if x.dtype.is_floating_point else ops.cast(x, popxl.float32)


def _sum_input(x, dtype=None):
    if dtype is not None:
        from ._common import pdtype

        return ops.cast(x, pdtype(dtype)) if x.dtype != pdtype(dtype) else x
    # torch sums bools and ints as int64 (held as int32 here)
    return ops.cast(x, popxl.int32) if x.dtype == popxl.bool else x


def _axes(x, dim) -> tuple[int, ...]:
    return norm_dims(dim, x.rank)


@lowers(torch.sum, "sum")
def _sum(ctx, x, dim=None, keepdim=False, dtype=None):
    return ops.sum(_sum_input(x, dtype), _axes(x, dim), keepdim)


@lowers(torch.mean, "mean")
def _mean(ctx, x, dim=None, keepdim=False, dtype=None):
    return ops.mean(_float(_sum_input(x, dtype)), _axes(x, dim), keepdim)


@lowers(torch.prod, "prod")
def _prod(ctx, x, dim=None, keepdim=False, dtype=None):
    return ops.prod(_sum_input(x, dtype), _axes(x, dim), keepdim)


def _extreme(x, which: str, dim=None, keepdim=False):
    reduce_fn, arg_fn = (ops.max, ops.argmax) if which == "max" else (ops.min, ops.argmin)
    if dim is None:
        return reduce_fn(x, None, False)
    if is_t(dim):  # torch.max(a, b): elementwise, torch.maximum's kernel (ties, NaN)
        return torch_call(torch.maximum if which == "max" else torch.minimum, *promote(x, dim))
    d = norm_dim(dim, x.rank)
    result = torch.return_types.max if which == "max" else torch.return_types.min
    return result((reduce_fn(x, d, keepdim), arg_fn(x, d, keepdim)))


@lowers(torch.max, "max")
def _max(ctx, x, dim=None, keepdim=False, other=None):
    return _extreme(x, "max", dim if other is None else other, keepdim)


@lowers(torch.min, "min")
def _min(ctx, x, dim=None, keepdim=False, other=None):
    return _extreme(x, "min", dim if other is None else other, keepdim)


@lowers(torch.amax, "amax")
def _amax(ctx, x, dim=(), keepdim=False):
    return ops.max(x, _axes(x, dim if dim != () else None), keepdim)


@lowers(torch.amin, "amin")
def _amin(ctx, x, dim=(), keepdim=False):
    return ops.min(x, _axes(x, dim if dim != () else None), keepdim)


def _arg(fn, x, dim, keepdim):
    if dim is None:
        flat = ops.reshape(x, (x.nelms,))
        out = fn(flat, 0, False)
        return ops.reshape(out, (1,) * x.rank) if keepdim else out
    return fn(x, norm_dim(dim, x.rank), keepdim)


@lowers(torch.argmax, "argmax")
def _argmax(ctx, x, dim=None, keepdim=False):
    return _arg(ops.argmax, x, dim, keepdim)


@lowers(torch.argmin, "argmin")
def _argmin(ctx, x, dim=None, keepdim=False):
    return _arg(ops.argmin, x, dim, keepdim)


def var(x: popxl.Tensor, dim=None, correction: float = 1.0, keepdim: bool = False) -> popxl.Tensor:
    """torch.var: mean squared deviation with ``n - correction`` in the denominator."""
    axes = _axes(x, dim)
    n = 1
    for a in axes:
        n *= x.shape[a]
    centred = x - ops.mean(x, axes, keepdims=True)
    return ops.sum(centred * centred, axes, keepdim) * (1.0 / max(n - correction, 0))


def vector_norm(x: popxl.Tensor, p=2, dim=None, keepdim: bool = False) -> popxl.Tensor:
    axes = _axes(x, dim)
    if p in (2, 2.0, "fro"):
        return ops.sqrt(ops.sum(x * x, axes, keepdim))
    if p in (1, 1.0):
        return ops.sum(ops.abs(x), axes, keepdim)
    if p == float("inf"):
        return ops.max(ops.abs(x), axes, keepdim)
    if p == float("-inf"):
        return ops.min(ops.abs(x), axes, keepdim)
    if p == 0:
        return ops.sum(
            ops.cast(ops.logical_not(ops.equal(x, const(0.0, x.dtype))), x.dtype), axes, keepdim
        )
    powered = ops.pow(ops.abs(x), const(float(p), x.dtype))
    return ops.pow(ops.sum(powered, axes, keepdim), const(1.0 / float(p), x.dtype))


# Variance, norms and logsumexp: torch's kernels reduce in their own order (Welford,
# vectorised sums), which no composition of PopXL ops reproduces bit for bit: theirs.
lowers(
    torch.logsumexp,
    "logsumexp",
    torch.var,
    "var",
    torch.std,
    "std",
    torch.var_mean,
    torch.std_mean,
    torch.linalg.vector_norm,
    F.normalize,
)(lower_torch_function)


@lowers(torch.norm, "norm")
def _norm(ctx, x, *args, **kwargs):
    p = args[0] if args else kwargs.get("p", "fro")
    if p == "nuc":
        raise NotImplementedError("torch.norm(p='nuc') needs an SVD, which is not supported")
    return lower_torch_function(ctx, x, *args, **kwargs)


@lowers(torch.all, "all")
def _all(ctx, x, dim=None, keepdim=False):
    as_int = ops.cast(ops.cast(x, popxl.bool), popxl.int32)
    return ops.cast(ops.min(as_int, _axes(x, dim), keepdim), popxl.bool)


@lowers(torch.any, "any")
def _any(ctx, x, dim=None, keepdim=False):
    as_int = ops.cast(ops.cast(x, popxl.bool), popxl.int32)
    return ops.cast(ops.max(as_int, _axes(x, dim), keepdim), popxl.bool)


# softmax -------------------------------------------------------------------------------------
def _implicit_dim(rank: int) -> int:
    return 0 if rank in (0, 1, 3) else 1  # torch's legacy rule for dim=None


def softmax(x: popxl.Tensor, dim=None, log: bool = False, dtype=None) -> popxl.Tensor:
    x = _sum_input(x, dtype) if dtype is not None else _float(x)
    d = norm_dim(_implicit_dim(x.rank) if dim is None else dim, x.rank)
    return ops.log_softmax(x, d) if log else ops.softmax(x, d)


@lowers(F.softmax, torch.softmax, "softmax")
@torch_kernel_when(lambda dtype, **_: dtype is not None)  # the cast happens inside torch's kernel
def _softmax(ctx, x, dim=None, _stacklevel=3, dtype=None):
    return softmax(x, dim, False, dtype)


@lowers(F.log_softmax, torch.log_softmax, "log_softmax")
@torch_kernel_when(lambda dtype, **_: dtype is not None)
def _log_softmax(ctx, x, dim=None, _stacklevel=3, dtype=None):
    return softmax(x, dim, True, dtype)


@lowers(nn.Softmax)
def _softmax_module(ctx, m, x):
    return softmax(x, m.dim)


@lowers(nn.LogSoftmax)
def _log_softmax_module(ctx, m, x):
    return softmax(x, m.dim, log=True)


@lowers(nn.Softmax2d)
def _softmax2d_module(ctx, m, x):
    return softmax(x, -3)


@lowers(torch.cumsum, "cumsum")
def _cumsum(ctx, x, dim, dtype=None, out=None):
    # torch sums in the out tensor's dtype, as with dtype= (the driver rebinds ``out``)
    if out is not None:
        dtype = out.dtype.as_torch()
    return ops.cumsum(_sum_input(x, dtype), norm_dim(dim, x.rank))


lowers(torch.cumprod, "cumprod")(lower_torch_function)  # torch's kernel and its gradient


@lowers(torch.topk, "topk")
def _topk(ctx, x, k, dim=-1, largest=True, sorted=True):
    values, indices = ops.topk(x, int(k), norm_dim(dim, x.rank), bool(largest), bool(sorted))
    return torch.return_types.topk((values, indices))


@lowers(F.one_hot)
def _one_hot(ctx, t, num_classes=-1):
    # num_classes=-1 means max(t) + 1, read from the example run (a static graph needs it)
    n = ctx.expected().shape[-1] if num_classes == -1 else int(num_classes)
    classes = popxl.constant(np.arange(n, dtype=np.int32))
    hot = ops.equal(ops.unsqueeze(ops.cast(t, popxl.int32), t.rank), classes)
    return ops.cast(hot, popxl.int64)
