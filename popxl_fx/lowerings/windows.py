"""``Tensor.unfold`` (the sliding windows of one dim) and ``index_fill`` (a value written at
some positions of one dim), from gathers and selects: each element is a copy of one input
element or of the value, so the results are eager's bit for bit.
"""

from __future__ import annotations

import numpy as np
import torch

import popxl_core as popxl
from popxl_core import ops

from ..lowering import lowers
from ._common import const, is_t, norm_dim
from .shape import _wrap

__all__: list = []


@lowers("unfold", torch.ops.aten.unfold)
def _unfold(ctx, x, dimension, size, step):
    """Windows of ``size`` every ``step`` along ``dimension``, as a new last axis."""
    if x.rank == 0:  # torch: a 0-d tensor unfolds to its one element
        return ops.reshape(x, (1,))
    d = norm_dim(dimension, x.rank)
    count = (x.shape[d] - size) // step + 1
    starts = np.arange(count)[:, None] * step + np.arange(size)[None, :]
    windows = ops.gather(x, popxl.constant(starts.astype(np.int32)), d)  # (..., n, size, ...)
    perm = [a for a in range(x.rank + 1) if a != d + 1] + [d + 1]
    return ops.transpose(windows, perm)


def _index_fill(ctx, x, dim, index, value):
    """``x`` with ``value`` at the positions ``index`` of dim ``dim``."""
    d = norm_dim(dim, x.rank)
    n = x.shape[d] if x.rank else 1
    hits = ops.equal(ops.reshape(_wrap(index, n), (-1, 1)), const(np.arange(n), popxl.int32))
    mask = ops.greater(ops.sum(ops.cast(hits, popxl.int32), [0]), const(0, popxl.int32))
    shape = [1] * x.rank
    if x.rank:
        shape[d] = n
    mask = ops.reshape(mask, tuple(shape))
    fill = ops.cast(value, x.dtype) if is_t(value) else const(value, x.dtype)
    return ops.where(mask, fill, x)


lowers("index_fill", "index_fill_", torch.index_fill, torch.ops.aten.index_fill)(_index_fill)
