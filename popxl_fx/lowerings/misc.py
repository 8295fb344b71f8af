"""Tensor creation from a tensor (*_like, new_*), triu/tril,
dropout (seeded with ctx.seed(); identity in eval or at p=0) and torchvision's
stochastic_depth.

torch.arange/zeros/ones/full/eye with constant shapes never reach the table: capture folds
them (their arguments hold no traced value) into constants."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import popxl_core as popxl
from popxl_core import ops

from ..lowering import lowers, lowers_when_imported
from ._common import pdtype
from ._sub import dropout, torch_rng

__all__: list = []


def _size(args: tuple, kwargs: dict) -> tuple[int, ...]:
    size = kwargs.pop("size", None)
    if size is None:
        size = args[0] if len(args) == 1 and isinstance(args[0], (tuple, list)) else args
    return tuple(int(s) for s in size)


def _dtype(dtype, value=None) -> popxl.dtype:
    if dtype is not None:
        return pdtype(dtype)
    if isinstance(value, bool):
        return popxl.bool
    if isinstance(value, int):
        return popxl.int32
    return pdtype(torch.get_default_dtype())


def _filled(shape, value, dt: popxl.dtype) -> popxl.Tensor:
    return popxl.constant(np.full(shape, value, dtype=dt.as_numpy()), dt)


def _like(value):
    def lower(ctx, x, *args, dtype=None, **kwargs):
        fill = args[0] if value is None else value
        return _filled(tuple(x.shape), fill, pdtype(dtype) if dtype else x.dtype)

    return lower


lowers(torch.zeros_like, torch.empty_like)(_like(0))
lowers(torch.ones_like)(_like(1))
lowers(torch.full_like)(_like(None))


def _new(value):
    def lower(ctx, x, *args, dtype=None, **kwargs):
        if value is None:  # new_full(size, fill_value)
            size, fill = args[0], args[1] if len(args) > 1 else kwargs.pop("fill_value")
        else:
            size, fill = _size(args, kwargs), value
        return _filled(tuple(size), fill, pdtype(dtype) if dtype else x.dtype)

    return lower


lowers("new_zeros", "new_empty")(_new(0))
lowers("new_ones")(_new(1))
lowers("new_full")(_new(None))


def _triangle(x, diagonal: int, upper: bool):
    rows, cols = x.shape[-2:]
    keep = (
        np.triu(np.ones((rows, cols), bool), diagonal)
        if upper
        else np.tril(np.ones((rows, cols), bool), diagonal)
    )
    zero = popxl.constant(np.zeros((), x.dtype.as_numpy()), x.dtype)
    return ops.where(popxl.constant(keep), x, zero)


@lowers(torch.triu, "triu")
def _triu(ctx, x, diagonal=0):
    return _triangle(x, diagonal, True)


@lowers(torch.tril, "tril")
def _tril(ctx, x, diagonal=0):
    return _triangle(x, diagonal, False)


# dropout -------------------------------------------------------------------------------------
@lowers(F.dropout, torch.dropout)
def _dropout(ctx, x, p=0.5, training=True, inplace=False):
    return dropout(ctx, x, p, training)


@lowers(nn.Dropout, nn.AlphaDropout)
def _dropout_module(ctx, m, x):
    if isinstance(m, nn.AlphaDropout) and ctx.training and m.p > 0:
        raise NotImplementedError(
            f"{ctx.module_path}: AlphaDropout in training mode is not supported"
        )
    return dropout(ctx, x, m.p, ctx.training)


def channel_dropout(ctx, x: popxl.Tensor, p: float, training: bool, r: int) -> popxl.Tensor:
    """Zero whole channels: one mask value per (N, C), broadcast over the spatial dims."""
    if not training or p == 0:
        return x
    batched = x.rank == r + 2
    shape = (tuple(x.shape[:2]) if batched else tuple(x.shape[:1])) + (1,) * r
    return _shaped(ctx, x, shape, float(p))


def _shaped(ctx, x: popxl.Tensor, shape: tuple, p: float) -> popxl.Tensor:
    """x times a noise of ``shape``: torch's draws (eager's masks) or the seeded stream's."""
    if torch_rng(ctx):
        return ops.mul(x, ops.torch_random(ops.DropoutNoise(p, tuple(shape)), [x])[0])
    return ops.shaped_dropout(x, ctx.seed(), shape, p)


for _r in (1, 2, 3):
    lowers(getattr(F, f"dropout{_r}d"))(
        lambda ctx, x, p=0.5, training=True, inplace=False, _r=_r: channel_dropout(
            ctx, x, p, training, _r
        )
    )
    lowers(getattr(nn, f"Dropout{_r}d"))(
        lambda ctx, m, x, _r=_r: channel_dropout(ctx, x, m.p, ctx.training, _r)
    )


@lowers_when_imported("torchvision.ops.stochastic_depth", "stochastic_depth")
def stochastic_depth(
    ctx, x: popxl.Tensor, p: float, mode: str, training: bool = True
) -> popxl.Tensor:
    """torchvision's stochastic depth: drop whole rows ('row') or the whole batch ('batch')."""
    if mode not in ("row", "batch"):
        raise ValueError(f"stochastic_depth: mode must be 'row' or 'batch', got {mode!r}")
    if not training or p == 0:
        return x
    if p == 1:
        return x * 0.0
    shape = (x.shape[0],) + (1,) * (x.rank - 1) if mode == "row" else (1,) * x.rank
    return _shaped(ctx, x, shape, float(p))
