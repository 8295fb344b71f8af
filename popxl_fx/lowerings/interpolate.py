"""F.interpolate / nn.Upsample: nearest, nearest-exact, linear, bilinear, trilinear and bicubic
(align_corners True or False, size or scale_factor) as one ``Upsample`` op, whose kernels are
torch's ``aten.upsample_*`` and their backward kernels: forward and gradient are bitwise
torch's. The arguments are resolved the way ``F.interpolate`` resolves them (output size
from ``scale_factor``, the scales the kernel gets, ``recompute_scale_factor``)."""

from __future__ import annotations

import math

import torch.nn as nn
import torch.nn.functional as F

import popxl_core as popxl
from popxl_core import ops

from ..lowering import lowers
from .aten_kernels import torch_kernel_when

__all__ = ["interpolate"]

_LINEAR = ("linear", "bilinear", "trilinear", "bicubic")
_MODES = ("nearest", "nearest-exact") + _LINEAR


def _per_dim(value, r: int, what: str) -> list:
    if not isinstance(value, (list, tuple)):
        return [value] * r
    if len(value) != r:
        raise ValueError(
            f"interpolate: {what} {tuple(value)} needs {r} entries, one per spatial dim"
        )
    return list(value)


def _out_sizes(x, size, scale_factor, recompute: bool):
    """(output sizes, scales the kernel gets) as F.interpolate computes them."""
    r = x.rank - 2
    if (size is None) == (scale_factor is None):
        raise ValueError("interpolate: exactly one of size or scale_factor must be given")
    if size is not None:
        return [int(s) for s in _per_dim(size, r, "size")], None
    scales = [float(s) for s in _per_dim(scale_factor, r, "scale_factor")]
    sizes = [int(math.floor(n * s)) for n, s in zip(x.shape[2:], scales)]
    return sizes, (None if recompute else scales)


def interpolate(
    x,
    size=None,
    scale_factor=None,
    mode="nearest",
    align_corners=None,
    recompute_scale_factor=None,
    antialias=False,
) -> popxl.Tensor:
    """torch.nn.functional.interpolate for every mode but "area" and antialiasing."""
    if mode not in _MODES:
        raise NotImplementedError(
            f"interpolate: mode {mode!r} is not supported (supported: {', '.join(_MODES)})"
        )
    if antialias:
        raise NotImplementedError("interpolate: antialias=True is not supported")
    if align_corners is not None and mode not in _LINEAR:
        raise ValueError(f"interpolate: align_corners only applies to {', '.join(_LINEAR)}")
    sizes, scales = _out_sizes(x, size, scale_factor, bool(recompute_scale_factor))
    corners = bool(align_corners) if mode in _LINEAR else None
    return ops.upsample(x, sizes, mode, corners, scales)


@lowers(F.interpolate, F.upsample)
@torch_kernel_when(lambda mode, antialias, **_: mode not in _MODES or antialias)  # "area", AA
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
