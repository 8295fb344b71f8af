"""Shape ops: permute/transpose, (un)squeeze, expand/repeat, cat/stack/split/chunk/unbind,
narrow/select/flip/roll, gather/index_select and torch-semantics ``__getitem__`` (basic
indexing plus integer-tensor advanced indexing, as in torch, not popxl's axis-0 rule).

(view/reshape/flatten live in basic.py and resolve -1 from shape propagation.)
"""

from __future__ import annotations

import builtins
import operator
from typing import Any

import numpy as np
import torch
import torch.nn as nn

import popxl_core as popxl
from popxl_core import ops
from popxl_core.ops.scatter import gather_elements

from ..lowering import lowers
from ._common import const, is_t, norm_dim, norm_dims, promote, tuple_of
from .aten_kernels import lower_torch_function

__all__ = ["getitem"]


def _sizes(args: tuple) -> tuple:
    """``f(2, 3)`` and ``f((2, 3))`` as one tuple."""
    return tuple(args[0]) if len(args) == 1 and isinstance(args[0], (tuple, list)) else args


@lowers("permute", torch.permute)
def _permute(ctx, x, *dims):
    return ops.transpose(x, [norm_dim(d, x.rank) for d in _sizes(dims)])


def swap(x: popxl.Tensor, d0: int, d1: int) -> popxl.Tensor:
    perm = list(range(x.rank))
    a, b = norm_dim(d0, x.rank), norm_dim(d1, x.rank)
    perm[a], perm[b] = perm[b], perm[a]
    return x if a == b else ops.transpose(x, perm)


# the in-place forms change the shape: lowered here, not decomposed from example values
# that the update has already changed
@lowers("transpose", torch.transpose, "swapaxes", torch.swapaxes, "swapdims", torch.swapdims)
@lowers("transpose_", "swapaxes_", "swapdims_")
def _transpose(ctx, x, d0, d1):
    return swap(x, d0, d1)


@lowers("t", torch.t, "t_")
def _t(ctx, x):
    return x if x.rank < 2 else swap(x, 0, 1)


@lowers("movedim", torch.movedim)
def _movedim(ctx, x, source, destination):
    src = [norm_dim(s, x.rank) for s in tuple_of(source, 1)]
    dst = [norm_dim(d, x.rank) for d in tuple_of(destination, 1)]
    rest = iter(d for d in range(x.rank) if d not in src)
    where = dict(zip(dst, src))
    return ops.transpose(x, [where[i] if i in where else next(rest) for i in range(x.rank)])


@lowers("unflatten", torch.unflatten, "view_as", "reshape_as")
def _to_expected(ctx, x, *args, **kwargs):
    return ops.reshape(x, tuple(ctx.expected().shape))


@lowers(nn.Unflatten)
def _unflatten_module(ctx, m, x):
    return ops.reshape(x, tuple(ctx.expected().shape))


@lowers("squeeze", torch.squeeze, "squeeze_")
def _squeeze(ctx, x, dim=None):
    # torch ignores dims whose size is not 1
    dims = norm_dims(dim, x.rank) if dim is not None else range(x.rank)
    drop = [d for d in dims if x.shape[d] == 1]
    return ops.squeeze(x, drop) if drop else x


@lowers("unsqueeze", torch.unsqueeze, "unsqueeze_")
def _unsqueeze(ctx, x, dim):
    return ops.unsqueeze(x, norm_dim(dim, x.rank + 1))


def _expand(x, sizes):
    sizes = list(sizes)
    lead = len(sizes) - x.rank
    shape = [x.shape[i - lead] if s == -1 else int(s) for i, s in enumerate(sizes)]
    if tuple(shape) == tuple(x.shape):
        return x
    return ops.expand(x, shape)


@lowers("expand")
def _expand_method(ctx, x, *sizes):
    return _expand(x, _sizes(sizes))


@lowers("expand_as")
def _expand_as(ctx, x, other):
    return _expand(x, other.shape)


@lowers(torch.broadcast_to)
def _broadcast_to(ctx, x, size):
    return _expand(x, size)


def repeat(x: popxl.Tensor, reps) -> popxl.Tensor:
    """torch's ``repeat`` (numpy ``tile``): each copy of an axis is an expand + reshape."""
    reps = list(reps)
    if len(reps) > x.rank:
        x = ops.reshape(x, (1,) * (len(reps) - x.rank) + tuple(x.shape))
    reps = [1] * (x.rank - len(reps)) + reps
    for axis, r in enumerate(reps):
        if r != 1:
            shape = list(x.shape)
            expanded = ops.expand(ops.unsqueeze(x, axis), shape[:axis] + [r] + shape[axis:])
            x = ops.reshape(expanded, shape[:axis] + [r * shape[axis]] + shape[axis + 1 :])
    return x


@lowers("repeat")
def _repeat(ctx, x, *reps):
    return repeat(x, _sizes(reps))


@lowers(torch.tile, "tile")
def _tile(ctx, x, dims):
    return repeat(x, dims)


@lowers(torch.cat, torch.concat, torch.concatenate)
def _cat(ctx, tensors, dim=0, axis=None):
    tensors = [t for t in tensors if not (t.rank == 1 and t.shape[0] == 0)]
    d = norm_dim(dim if axis is None else axis, tensors[0].rank)
    tensors = promote(*tensors)  # torch.cat promotes mixed dtypes (int with float: float)
    return tensors[0] if len(tensors) == 1 else ops.concat(tensors, d)


@lowers(torch.stack)
def _stack(ctx, tensors, dim=0):
    d = norm_dim(dim, tensors[0].rank + 1)
    return ops.concat([ops.unsqueeze(t, d) for t in tensors], d)


def split_sizes(n: int, size: int) -> list[int]:
    return [min(size, n - i) for i in range(0, n, size)]


@lowers("split", torch.split)
def _split(ctx, x, split_size_or_sections, dim=0):
    d = norm_dim(dim, x.rank)
    sizes = (
        split_sizes(x.shape[d], int(split_size_or_sections))
        if isinstance(split_size_or_sections, int)
        else list(split_size_or_sections)
    )
    return tuple(ops.split(x, sizes, d)) if len(sizes) > 1 else (x,)


@lowers("chunk", torch.chunk)
def _chunk(ctx, x, chunks, dim=0):
    d = norm_dim(dim, x.rank)
    sizes = split_sizes(x.shape[d], -(-x.shape[d] // int(chunks)))
    return tuple(ops.split(x, sizes, d)) if len(sizes) > 1 else (x,)


@lowers("unbind", torch.unbind)
def _unbind(ctx, x, dim=0):
    d = norm_dim(dim, x.rank)
    parts = ops.split(x, [1] * x.shape[d], d) if x.shape[d] > 1 else [x]
    return tuple(ops.squeeze(p, [d]) for p in parts)


@lowers("narrow", torch.narrow)
def _narrow(ctx, x, dim, start, length):
    d = norm_dim(dim, x.rank)
    start = start % x.shape[d]
    return ops.slice(x, start, start + int(length), axis=d)


@lowers("select", torch.select)
def _select(ctx, x, dim, index):
    d = norm_dim(dim, x.rank)
    i = index % x.shape[d]
    return ops.squeeze(ops.slice(x, i, i + 1, axis=d), [d])


def flip(x: popxl.Tensor, dims) -> popxl.Tensor:
    for d in norm_dims(dims, x.rank):
        x = ops.slice(x, x.shape[d] - 1, None, -1, axis=d)
    return x


# flip, roll, index_select: torch's own kernels (any dims= form, 0-d tensors, eager's
# gradients)
lowers("flip", torch.flip, "roll", torch.roll, "index_select", torch.index_select)(
    lower_torch_function
)


def _wrap(index, n: int):
    """Negative run-time indices count from the end, as in torch."""
    if not is_t(index):
        return popxl.constant((np.asarray(index) % n).astype(np.int32))
    if index.dtype not in (popxl.int32, popxl.uint32):
        index = ops.cast(index, popxl.int32)
    return ops.where(ops.less(index, const(0, index.dtype)), index + n, index)


@lowers("gather", torch.gather)
def _gather(ctx, x, dim, index, sparse_grad=False):
    d = norm_dim(dim, x.rank)
    # torch allows an index shorter than x on the other axes: it reads x's leading part there
    short = [a for a in range(x.rank) if a != d and index.shape[a] < x.shape[a]]
    if short:
        x = ops.slice(x, [0] * len(short), [index.shape[a] for a in short], None, short)
    return gather_elements(x, _wrap(index, x.shape[d]), d)


# __getitem__ ---------------------------------------------------------------------------------
_BASIC = (int, np.integer, builtins.slice, type(None))


def _is_advanced(item: Any) -> bool:
    return is_t(item) or isinstance(item, (list, np.ndarray, torch.Tensor))


def _expand_ellipsis(x, items: tuple) -> list:
    consumed = sum(1 for i in items if i is not None and i is not Ellipsis)
    fill = [builtins.slice(None)] * (x.rank - consumed)
    if Ellipsis not in [i for i in items if not _is_advanced(i)]:
        return list(items) + fill
    at = next(k for k, i in enumerate(items) if not _is_advanced(i) and i is Ellipsis)
    return list(items[:at]) + fill + list(items[at + 1 :])


def _basic_part(items: list) -> tuple[list, list]:
    """Items with advanced indices replaced by full slices, and the axes (after basic
    indexing) the advanced indices apply to."""
    basic, adv, axis = [], [], 0
    for item in items:
        if _is_advanced(item):
            basic.append(builtins.slice(None))
            adv.append((axis, item))
            axis += 1
        else:
            basic.append(item)
            axis += 0 if isinstance(item, (int, np.integer)) else 1
    return basic, adv


def _linear_index(x, adv: list):
    """One index into the merged advanced axes (row-major), broadcasting the indices."""
    flat = None
    for axis, idx in adv:
        i = _wrap(idx, x.shape[axis])
        flat = i if flat is None else flat * x.shape[axis] + i
    return flat


def _advanced(x, adv: list):
    axes = [a for a, _ in adv]
    adjacent = axes == list(range(axes[0], axes[0] + len(axes)))
    if not adjacent:  # torch puts the indexed dims first
        rest = [a for a in range(x.rank) if a not in axes]
        x = ops.transpose(x, axes + rest)
        adv = [(k, idx) for k, (_, idx) in enumerate(adv)]
        axes = list(range(len(axes)))
    first, n = axes[0], len(axes)
    merged = (
        ops.reshape(x, tuple(x.shape[:first]) + (-1,) + tuple(x.shape[first + n :])) if n > 1 else x
    )
    return ops.gather(merged, _linear_index(x, adv), first)


def getitem(x: popxl.Tensor, index, expected_shape=None) -> popxl.Tensor:
    """``x[index]`` with torch's semantics (see the module docstring)."""
    items = _expand_ellipsis(x, index if isinstance(index, tuple) else (index,))
    basic, adv = _basic_part(items)
    out = x[tuple(basic)] if any(b != builtins.slice(None) for b in basic) else x
    if adv:
        if any(getattr(i, "dtype", None) in (popxl.bool, torch.bool) for _, i in adv):
            raise NotImplementedError("boolean-mask indexing has a data-dependent shape")
        out = _advanced(out, adv)
    if expected_shape is not None and tuple(out.shape) != tuple(expected_shape):
        raise NotImplementedError(
            f"indexing {tuple(x.shape)} with {index!r} mixes integer and tensor indices in a "
            f"way whose result layout is not supported (got {tuple(out.shape)}, torch "
            f"{tuple(expected_shape)})"
        )
    return out


@lowers(operator.getitem)
def _getitem(ctx, obj, index):
    if not is_t(obj):
        return obj[index]  # a tuple/list of outputs (split, lstm, max with dim...)
    expected = ctx.expected()
    return getitem(obj, index, getattr(expected, "shape", None))
