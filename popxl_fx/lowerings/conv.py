"""Convolutions (conv1d/2d/3d incl. groups, dilation, 'same'/'valid' and the reflect,
replicate and circular padding modes), transposed convolutions and ``F.pad``.

Pads are built from slices and concats, so autodiff gives their gradients.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

import popxl_core as popxl
from popxl_core import ops

from ..lowering import lowers
from ._common import const, tuple_of
from .aten_kernels import torch_kernel_when

__all__ = ["conv_nd", "pad"]


# padding -------------------------------------------------------------------------------------
def _edge(x: popxl.Tensor, axis: int, before: int, after: int, mode: str, value: float):
    """The ``before`` and ``after`` blocks that ``mode`` adds along ``axis``."""
    n = x.shape[axis]
    if mode == "constant":

        def block(k):
            shape = list(x.shape)
            shape[axis] = k
            return ops.expand(const(value, x.dtype), shape)

        return block(before), block(after)
    if mode == "circular":
        return ops.slice(x, n - before, n, axis=axis), ops.slice(x, 0, after, axis=axis)
    if mode == "replicate":

        def rep(i, k):
            shape = list(x.shape)
            shape[axis] = k
            return ops.expand(ops.slice(x, i, i + 1, axis=axis), shape)

        return rep(0, before), rep(n - 1, after)
    if mode == "reflect":
        if before >= n or after >= n:
            raise ValueError(
                f"reflect padding ({before}, {after}) must be smaller than the "
                f"padded dim of size {n}"
            )
        stop = n - 2 - after
        return (
            ops.slice(x, before, 0, -1, axis=axis),
            ops.slice(x, n - 2, None if stop < 0 else stop, -1, axis=axis),
        )
    raise ValueError(
        f"pad: mode {mode!r} is not supported (constant, reflect, replicate, circular)"
    )


def _pad_axis(x, axis: int, before: int, after: int, mode: str, value: float):
    if before < 0 or after < 0:  # torch crops for negative pads
        x = ops.slice(x, max(-before, 0), x.shape[axis] - max(-after, 0), axis=axis)
        before, after = max(before, 0), max(after, 0)
    if before == 0 and after == 0:
        return x
    left, right = _edge(x, axis, before, after, mode, value)
    parts = ([left] if before else []) + [x] + ([right] if after else [])
    return ops.concat(parts, axis)


def pad(
    x: popxl.Tensor, pads: Sequence[int], mode: str = "constant", value: float | None = None
) -> popxl.Tensor:
    """``F.pad``: ``pads`` are (left, right) pairs starting from the last axis."""
    if len(pads) % 2 or len(pads) // 2 > x.rank:
        raise ValueError(
            f"pad: {list(pads)} must hold (before, after) pairs for at most "
            f"{x.rank} axes of {tuple(x.shape)}"
        )
    for i in range(len(pads) // 2):
        x = _pad_axis(
            x,
            x.rank - 1 - i,
            int(pads[2 * i]),
            int(pads[2 * i + 1]),
            mode,
            0.0 if value is None else float(value),
        )
    return x


@lowers(F.pad, torch.constant_pad_nd)
@torch_kernel_when(lambda mode, **_: mode != "constant")  # eager's kernels and gradients
def _pad(ctx, x, pad, mode="constant", value=None):
    return pad_impl(x, pad, mode, value)


pad_impl = pad


# conv ----------------------------------------------------------------------------------------
def _same_pads(kernel: Sequence[int], dilation: Sequence[int]) -> tuple[int, ...]:
    """torch's padding='same': the odd pad element goes to the end."""
    total = [d * (k - 1) for k, d in zip(kernel, dilation)]
    return tuple(t // 2 for t in total) + tuple(t - t // 2 for t in total)


def _onnx_pads(padding, r: int, kernel, dilation) -> tuple[int, ...]:
    if padding == "same":
        return _same_pads(kernel, dilation)
    if padding == "valid":
        return (0,) * (2 * r)
    p = tuple_of(padding, r)
    return p + p


def _add_bias(y: popxl.Tensor, bias) -> popxl.Tensor:
    if bias is None:
        return y
    return y + ops.reshape(bias, (bias.shape[0],) + (1,) * (y.rank - 2))


def conv_nd(
    x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, padding_mode: str = "zeros"
) -> popxl.Tensor:
    """torch's convolution over the spatial dims of ``x`` (N, C, *spatial)."""
    r = weight.rank - 2
    stride, dilation = tuple_of(stride, r), tuple_of(dilation, r)
    pads = _onnx_pads(padding, r, weight.shape[2:], dilation)
    if padding_mode != "zeros" and any(pads):
        torch_pads = [p for i in reversed(range(r)) for p in (pads[i], pads[r + i])]
        x, pads = pad(x, torch_pads, padding_mode), (0,) * (2 * r)
    if x.rank == r + 1:  # an unbatched input
        return (
            ops.squeeze(
                conv_nd(ops.unsqueeze(x, 0), weight, bias, stride, pads[:r], dilation, groups), 0
            )
            if pads[:r] == pads[r:]
            else _unbatched_error(x)
        )
    # the bias goes into the conv op: torch adds it inside its conv kernel (and sums its
    # gradient in the conv backend), so a separate add would round differently
    return ops.conv(x, weight, stride, pads, dilation, int(groups), bias=bias)


def _unbatched_error(x):
    raise ValueError(
        f"conv: unbatched input {tuple(x.shape)} with asymmetric 'same' padding "
        "is not supported; add a batch dim"
    )


@lowers(F.conv1d, F.conv2d, F.conv3d, torch.conv1d, torch.conv2d, torch.conv3d)
def _conv(ctx, x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    return conv_nd(x, weight, bias, stride, padding, dilation, groups)


@lowers(nn.Conv1d, nn.Conv2d, nn.Conv3d)
def _conv_module(ctx, m, x):
    bias = ctx.param("bias") if m.bias is not None else None
    return conv_nd(
        x, ctx.param("weight"), bias, m.stride, m.padding, m.dilation, m.groups, m.padding_mode
    )


# transposed conv -----------------------------------------------------------------------------
def conv_transpose_nd(
    x, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1
) -> popxl.Tensor:
    """torch's conv_transpose (weight (C_in, C_out/groups, *k))."""
    r = weight.rank - 2
    p = tuple_of(padding, r)
    y = ops.conv_transpose(
        x,
        weight,
        tuple_of(stride, r),
        p + p,
        tuple_of(dilation, r),
        int(groups),
        output_padding=tuple_of(output_padding, r),
    )
    return _add_bias(y, bias)


@lowers(
    F.conv_transpose1d,
    F.conv_transpose2d,
    F.conv_transpose3d,
    torch.conv_transpose1d,
    torch.conv_transpose2d,
    torch.conv_transpose3d,
)
def _conv_transpose(
    ctx, x, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1
):
    return conv_transpose_nd(x, weight, bias, stride, padding, output_padding, groups, dilation)


@lowers(nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)
def _conv_transpose_module(ctx, m, x, output_size=None):
    if output_size is not None:
        raise NotImplementedError(
            f"{ctx.module_path or type(m).__name__}: output_size is not "
            "supported; set output_padding on the module instead"
        )
    if m.padding_mode != "zeros":
        raise ValueError(f"{ctx.module_path}: ConvTranspose supports only padding_mode='zeros'")
    bias = ctx.param("bias") if m.bias is not None else None
    return conv_transpose_nd(
        x, ctx.param("weight"), bias, m.stride, m.padding, m.output_padding, m.groups, m.dilation
    )
