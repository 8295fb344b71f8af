"""What `gather` and `scatter` check of their indices and axis, and their cost (a move)."""

from __future__ import annotations

import numpy as np

from ..tensor import Constant, Tensor
from .registry import Cost, _user_frame

__all__ = ["check_axis", "check_constant_indices", "check_indices", "move_cost"]


def move_cost(ins, outs, attrs) -> Cost:
    return Cost(0, 2 * sum(s.nbytes for s in outs) + sum(s.nbytes for s in ins[1:2]))


def check_indices(idx, what: str) -> None:
    if not idx.dtype.is_int:
        raise TypeError(f"{what} indices must be an integer tensor, got {idx.dtype.name}")


def check_axis(axis: int, rank: int, what: str) -> int:
    if not -rank <= axis < rank:
        raise ValueError(f"{what} axis {axis} is out of range for rank {rank}")
    return axis % rank


def check_constant_indices(t: Tensor, idx, axis: int, what: str) -> None:
    """Indices known at build time (a Constant or host data) are checked at build time."""
    if isinstance(idx, Tensor) and not isinstance(idx, Constant):
        return
    data = np.asarray(idx._data if isinstance(idx, Constant) else idx)
    if not np.issubdtype(data.dtype, np.integer) or not -t.rank <= axis < t.rank:
        return
    n = t.shape[axis]
    bad = data[(data < 0) | (data >= n)]
    if bad.size:
        name = f" of {idx.id!r}" if isinstance(idx, Tensor) else ""
        raise IndexError(
            f"{what}: constant indices {bad[:5].tolist()}{name} are outside [0, {n}) "
            f"on axis {axis} of {t.id!r} {t.shape}{_user_frame()}"
        )
