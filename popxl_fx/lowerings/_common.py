"""Helpers shared by the lowering families: dtypes, scalars, axes and torch's type promotion."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

import popxl_core as popxl
from popxl_core import ops

__all__ = [
    "broadcast_to",
    "const",
    "is_t",
    "norm_dim",
    "norm_dims",
    "pdtype",
    "promote",
    "scalar_dtype",
    "single",
    "tuple_of",
]

# The IPU has no 64-bit types: popxl stores torch's int64/float64 as int32/float32.
_NARROW = {torch.int64: torch.int32, torch.float64: torch.float32}


def is_t(x: Any) -> bool:
    return isinstance(x, popxl.Tensor)


def pdtype(dt: torch.dtype) -> popxl.dtype:
    """The popxl dtype that holds torch dtype ``dt``."""
    return popxl.dtype.as_dtype(_NARROW.get(dt, dt))


def const(value: Any, dtype: popxl.dtype) -> popxl.Tensor:
    """A constant of ``dtype`` in the current graph."""
    return popxl.constant(np.asarray(value, dtype=dtype.as_numpy()), dtype)


def _rank(dt: popxl.dtype) -> int:
    return 2 if dt.is_floating_point else (1 if dt.is_int else 0)


def scalar_dtype(x: Any) -> popxl.dtype:
    """torch's category of a python scalar: bool < int < float."""
    if isinstance(x, bool):
        return popxl.bool
    return popxl.int32 if isinstance(x, int) else popxl.float32


def promote(*xs: Any) -> list:
    """Tensors and python scalars as tensors of one dtype, following torch's rule that a
    scalar only raises the category (bool < int < float), never the width."""
    tensors = [x for x in xs if is_t(x)]
    if not tensors:
        raise TypeError(f"expected at least one tensor among {xs!r}")
    # between tensors the wider type of the highest category wins (float16 + float32 -> 32)
    best = max((t.dtype for t in tensors), key=lambda d: (_rank(d), d.itemsize))
    for x in xs:
        if not is_t(x) and _rank(scalar_dtype(x)) > _rank(best):
            best = scalar_dtype(x)
    return [
        (ops.cast(x, best) if x.dtype != best else x) if is_t(x) else const(x, best) for x in xs
    ]


def norm_dim(dim: int, rank: int) -> int:
    """A possibly negative dim as an axis in [0, rank)."""
    if not -max(rank, 1) <= dim < max(rank, 1):
        raise IndexError(f"dim {dim} is out of range for a tensor of rank {rank}")
    return dim % max(rank, 1)


def norm_dims(dims: Any, rank: int) -> tuple[int, ...]:
    """``None`` (all), an int or a sequence of dims as sorted non-negative axes."""
    if dims is None:
        return tuple(range(rank))
    if isinstance(dims, int):
        dims = (dims,)
    return tuple(sorted(norm_dim(int(d), rank) for d in dims))


def tuple_of(value: Any, n: int) -> tuple[int, ...]:
    """An int repeated ``n`` times, or a sequence as a tuple of ints."""
    if isinstance(value, (int, np.integer)):
        return (int(value),) * n
    out = tuple(int(v) for v in value)
    return out * n if len(out) == 1 and n > 1 else out


def broadcast_to(t: popxl.Tensor, shape: Sequence[int]) -> popxl.Tensor:
    return t if tuple(t.shape) == tuple(shape) else ops.expand(t, tuple(shape))


def single(args: Sequence[Any]) -> Any:
    """The sequence argument of ``cat``-like calls, given either as one list or as varargs."""
    return list(args[0]) if len(args) == 1 and isinstance(args[0], (list, tuple)) else list(args)
