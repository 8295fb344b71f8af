"""Slices at a start computed in the model: `dynamic_slice` and `dynamic_update`, a window of
static size at a run-time offset (PopTorch's ``poptorch.dynamic_slice`` / ``dynamic_update``).

Each is a plain torch function, so eager torch (and the capture's example values) compute
what PopTorch's CPU kernels compute: torch's ``slice`` and ``slice_scatter`` from the start's
first element. A start that would put the window past the tensor's end is moved back so the
window fits, as popxl's DynamicSlice / DynamicUpdate do on the device (PopTorch's CPU kernel
would shorten the slice, or fail to update). The lowering reads the start on the device.
"""

from __future__ import annotations

import torch

import popxl_core as popxl
from popxl_core import ops

from ..lowering import lowers
from ._common import norm_dim

__all__ = ["dynamic_slice", "dynamic_update"]


def _start(start: torch.Tensor, length: int, size: int) -> int:
    """The start's first element, kept so the window fits, as the device keeps it."""
    return min(max(int(start.reshape(-1)[0]), 0), max(length - size, 0))


def dynamic_slice(t: torch.Tensor, dim: int, start: torch.Tensor, size: int, step: int):
    """``t``'s elements ``start, start + step, ...`` below ``start + size`` along ``dim``."""
    begin = _start(start, t.shape[dim], size)
    return torch.ops.aten.slice(t, dim, begin, begin + size, step)


def dynamic_update(t: torch.Tensor, src: torch.Tensor, dim: int, start: torch.Tensor, size: int):
    """A copy of ``t`` with ``src`` written at ``start, ..., start + size - 1`` along ``dim``."""
    begin = _start(start, t.shape[dim], size)
    return torch.slice_scatter(t, src, dim, begin, begin + size)


def _index(start: popxl.Tensor) -> popxl.Tensor:
    """The run-time offset as popxl's (1,) int32 index."""
    flat = ops.reshape(start, (-1,))
    return ops.cast(ops.slice(flat, start=0, stop=1, axis=0), popxl.int32)


@lowers(dynamic_slice)
def _lower_slice(ctx, t, dim, start, size, step):
    dim = norm_dim(dim, len(t.shape))
    window = ops.dynamic_slice(t, _index(start), [dim], [size], True)
    if step == 1:
        return window
    return ops.slice(window, start=0, stop=size, step=step, axis=dim)


@lowers(dynamic_update)
def _lower_update(ctx, t, src, dim, start, size):
    dim = norm_dim(dim, len(t.shape))
    return ops.dynamic_update(t, _index(start), src, [dim], [size], True)
