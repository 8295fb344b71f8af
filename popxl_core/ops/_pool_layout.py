"""2-D max pooling through torch's channels-last kernel where that is faster: the same bits.

torch's CPU max pooling of a contiguous NCHW tensor walks each window one element at a time:
resnet's stem pool (3x3, stride 2, batch 16 of 64x32x32) takes ~8 ms on one thread, 4 % of
a resnet18 training step. Over a channels-last tensor the same pooling runs vectorised across
channels in ~0.5 ms, and the two transposes cost ~1.2 ms. Both of torch's kernels take a
window's first maximum in row-major order and the last NaN they meet (``val > max or
isnan(val)``), with the window's first in-bounds element where every element is -inf: the
values and the indices are the same bits (tests/test_pool_layout.py checks ties, NaN,
infinities and signed zeros over random shapes, strides, pads, dilations and ceil_mode).
Indices are offsets in the input's H x W plane in both layouts.

Where channels-last does not pay (few channels, small tensors, other dtypes or layouts),
torch's kernel runs on the input as it is.
"""

from __future__ import annotations

import torch

__all__ = ["max_pool2d", "max_pool2d_with_indices"]

_aten = torch.ops.aten

# measured on one thread (AMD EPYC): below 8 channels the channels-last kernel has too few
# lanes to win; below 16 Ki elements the transposes' fixed cost exceeds the pooling's
_MIN_CHANNELS = 8
_MIN_NUMEL = 16 * 1024
# torch copies a 2-D transposed matrix by cache blocks from 3600 elements; one image's
# (C, H*W) plane up to 256 Ki elements transposes fastest that way, image by image
_BLOCKED_PLANE = (3600, 256 * 1024)


def _pays(x: torch.Tensor) -> bool:
    return (
        x.dim() == 4
        and x.dtype in (torch.float32, torch.float64)
        and x.device.type == "cpu"
        and x.shape[1] >= _MIN_CHANNELS
        and x.numel() >= _MIN_NUMEL
        and x.is_contiguous()
    )


def _channels_last(x: torch.Tensor) -> torch.Tensor:
    """A channels-last copy of contiguous NCHW ``x``."""
    n, c, h, w = x.shape
    if not _BLOCKED_PLANE[0] <= c * h * w <= _BLOCKED_PLANE[1]:
        return x.contiguous(memory_format=torch.channels_last)
    out = torch.empty((n, h * w, c), dtype=x.dtype)
    planes = x.view(n, c, h * w)
    for i in range(n):  # one blocked 2-D transpose per image
        out[i].copy_(planes[i].t())
    return out.view(n, h, w, c).permute(0, 3, 1, 2)


def max_pool2d_with_indices(x, kernel, stride, padding, dilation, ceil_mode):
    """``aten.max_pool2d_with_indices`` (its arguments as it takes them) with its bits,
    contiguous NCHW results."""
    args = (kernel, stride, padding, dilation, ceil_mode)
    if not _pays(x):
        return _aten.max_pool2d_with_indices(x, *args)
    y, idx = _aten.max_pool2d_with_indices(_channels_last(x), *args)
    return y.contiguous(), idx.contiguous()


def max_pool2d(x, kernel, stride, padding, dilation, ceil_mode):
    """``aten.max_pool2d``'s values with its bits (the indices are not kept)."""
    args = (kernel, stride, padding, dilation, ceil_mode)
    if not _pays(x):
        return _aten.max_pool2d(x, *args)
    return _aten.max_pool2d_with_indices(_channels_last(x), *args)[0].contiguous()
