"""F.interpolate / nn.Upsample: nearest, nearest-exact and (bi/tri)linear with
align_corners True or False, as constant gathers (nearest) or constant interpolation matrices
(linear), one spatial dim at a time, with torch's source-index rules."""

from __future__ import annotations

import math

import numpy as np
import torch.nn as nn
import torch.nn.functional as F

import popxl_core as popxl
from popxl_core import ops

from ..lowering import lowers

__all__ = ["interpolate"]

_LINEAR = ("linear", "bilinear", "trilinear")


def _out_sizes(x, size, scale_factor, r: int) -> tuple[list[int], list[float | None]]:
    ins = list(x.shape[2:])
    if size is not None:
        sizes = [int(size)] * r if isinstance(size, int) else [int(s) for s in size]
        return sizes, [None] * r
    scales = (
        [float(scale_factor)] * r
        if isinstance(scale_factor, (int, float))
        else [float(s) for s in scale_factor]
    )
    return [int(math.floor(n * s)) for n, s in zip(ins, scales)], scales


def _ratio(n_in: int, n_out: int, scale: float | None, align_corners: bool) -> float:
    """torch's area_pixel_compute_scale."""
    if align_corners:
        return (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
    return 1.0 / scale if scale is not None and scale > 0 else n_in / n_out


def _nearest_index(n_in: int, n_out: int, scale, exact: bool) -> np.ndarray:
    r = np.float32(_ratio(n_in, n_out, scale, False))
    i = np.arange(n_out, dtype=np.float32)
    src = np.floor((i + np.float32(0.5)) * r) if exact else np.floor(i * r)
    return np.minimum(src.astype(np.int64), n_in - 1).astype(np.int32)


def _linear_matrix(n_in: int, n_out: int, scale, align_corners: bool) -> np.ndarray:
    r = np.float32(_ratio(n_in, n_out, scale, align_corners))
    i = np.arange(n_out, dtype=np.float32)
    if align_corners:
        src = i * r
    else:
        src = np.maximum((i + np.float32(0.5)) * r - np.float32(0.5), np.float32(0.0))
    i0 = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
    i1 = np.minimum(i0 + 1, n_in - 1)
    w1 = (src - i0).astype(np.float32)
    m = np.zeros((n_out, n_in), np.float32)
    np.add.at(m, (np.arange(n_out), i0), np.float32(1.0) - w1)
    np.add.at(m, (np.arange(n_out), i1), w1)
    return m


def _along_last(x, axis: int, fn):
    if axis == x.rank - 1:
        return fn(x)
    perm = list(range(x.rank))
    perm[axis], perm[-1] = perm[-1], perm[axis]
    return ops.transpose(fn(ops.transpose(x, perm)), perm)


def interpolate(
    x,
    size=None,
    scale_factor=None,
    mode="nearest",
    align_corners=None,
    recompute_scale_factor=None,
    antialias=False,
) -> popxl.Tensor:
    """torch.nn.functional.interpolate for nearest/nearest-exact/(bi/tri)linear."""
    r = x.rank - 2
    if antialias:
        raise NotImplementedError("interpolate: antialias=True is not supported")
    if mode not in ("nearest", "nearest-exact") + _LINEAR:
        raise NotImplementedError(
            f"interpolate: mode {mode!r} is not supported (nearest, "
            "nearest-exact, linear, bilinear, trilinear)"
        )
    sizes, scales = _out_sizes(x, size, scale_factor, r)
    if recompute_scale_factor:
        scales = [None] * r
    for i, (n_out, scale) in enumerate(zip(sizes, scales)):
        axis, n_in = 2 + i, x.shape[2 + i]
        if mode in _LINEAR:
            m = _linear_matrix(n_in, n_out, scale, bool(align_corners))
            x = _along_last(
                x, axis, lambda t, m=m: ops.matmul(t, popxl.constant(m.T.copy(), t.dtype))
            )
        elif n_in != n_out or scale not in (None, 1.0):
            idx = _nearest_index(n_in, n_out, scale, mode == "nearest-exact")
            x = ops.gather(x, popxl.constant(idx), axis)
    return x


@lowers(F.interpolate, F.upsample)
def _interpolate(
    ctx,
    x,
    size=None,
    scale_factor=None,
    mode="nearest",
    align_corners=None,
    recompute_scale_factor=None,
    antialias=False,
):
    return interpolate(
        x, size, scale_factor, mode, align_corners, recompute_scale_factor, antialias
    )


@lowers(nn.Upsample)
def _upsample(ctx, m, x):
    return interpolate(
        x,
        m.size,
        m.scale_factor,
        m.mode,
        m.align_corners,
        getattr(m, "recompute_scale_factor", None),
    )
