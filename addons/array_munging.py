"""Host-array helpers for replicated and tensor-parallel data (popxl_addons.array_munging).

Sharded arrays carry the shard index on a new leading axis; "2D" sharding splits two axes,
the first one outermost.

>>> shard(np.arange(6).reshape(3, 2), 2, axis=1).tolist()
[[[0], [2], [4]], [[1], [3], [5]]]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np

__all__ = [
    "handle_negative_axis",
    "pad_axis",
    "repeat",
    "repeat_axis",
    "repeat_shard",
    "shard",
    "shard2D",
    "split2D",
    "squeeze_safe",
    "tensor_parallel_input",
    "unshard",
    "unshard2D",
    "unshard_arrays",
]


def handle_negative_axis(x: np.ndarray, axis: int) -> int:
    """``axis`` of ``x`` as a non-negative index; IndexError if out of range."""
    rank = np.ndim(x)
    if not -rank <= axis < rank:
        raise IndexError(f"axis {axis} is out of range for an array of rank {rank}")
    return axis % rank


def shard(x: np.ndarray, n: int, axis: int) -> np.ndarray:
    """``x`` split into ``n`` equal parts along ``axis``, stacked on a new axis 0."""
    return np.stack(np.split(np.asarray(x), n, axis=handle_negative_axis(x, axis)))


def unshard_arrays(arrays: Sequence[np.ndarray], axis: int) -> np.ndarray:
    """The inverse of splitting: ``arrays`` joined along ``axis``."""
    return np.concatenate(list(arrays), axis=handle_negative_axis(arrays[0], axis))


def unshard(x: np.ndarray, axis: int) -> np.ndarray:
    """The inverse of `shard`: the shards (axis 0 of ``x``) joined along ``axis``."""
    return unshard_arrays(list(x), axis)


def repeat(x: np.ndarray, n: int, axis: int = 0) -> np.ndarray:
    """``n`` copies of ``x`` stacked on a new ``axis``."""
    x = np.asarray(x)
    return np.repeat(np.expand_dims(x, axis), n, axis=axis)


def repeat_axis(x: np.ndarray, n: int, axis: int = 0) -> np.ndarray:
    """``n`` copies of ``x`` concatenated along the existing ``axis``."""
    return np.concatenate([np.asarray(x)] * n, axis=handle_negative_axis(x, axis))


def split2D(x: np.ndarray, n1: int, n2: int, axis1: int, axis2: int) -> list[np.ndarray]:
    """``n1 * n2`` blocks: split along ``axis1`` (outer), each part along ``axis2``."""
    a1, a2 = handle_negative_axis(x, axis1), handle_negative_axis(x, axis2)
    return [b for part in np.split(np.asarray(x), n1, a1) for b in np.split(part, n2, a2)]


def shard2D(x: np.ndarray, n1: int, n2: int, axis1: int, axis2: int) -> np.ndarray:
    """The blocks of `split2D` stacked on a new axis 0 (``axis1`` outermost)."""
    return np.stack(split2D(x, n1, n2, axis1, axis2))


def unshard2D(x: np.ndarray, n1: int, n2: int, axis1: int, axis2: int) -> np.ndarray:
    """The inverse of `shard2D`."""
    blocks = list(x)
    rows = [unshard_arrays(blocks[i * n2 : (i + 1) * n2], axis2) for i in range(n1)]
    return unshard_arrays(rows, axis1)


def repeat_shard(
    x: np.ndarray,
    n_repeats: int,
    n_shards: int,
    shard_axis: int,
    sharded_tensor: Literal["contiguous", "strided"] = "contiguous",
) -> np.ndarray:
    """Shards of ``x`` for ``n_repeats * n_shards`` replicas: 'contiguous' repeats the whole
    set of shards (0, 1, 0, 1), 'strided' repeats each shard in place (0, 0, 1, 1)."""
    shards = shard(x, n_shards, shard_axis)
    if sharded_tensor == "contiguous":
        return np.concatenate([shards] * n_repeats)
    if sharded_tensor == "strided":
        return np.repeat(shards, n_repeats, axis=0)
    raise ValueError(f"sharded_tensor must be 'contiguous' or 'strided', got {sharded_tensor!r}")


def tensor_parallel_input(x: np.ndarray, tp: int, rf: int) -> np.ndarray:
    """Host data for ``rf`` replicas in groups of ``tp`` tensor-parallel replicas.

    Axis 0 of ``x`` is split over the ``rf // tp`` data-parallel groups and every replica of
    a group gets the same part: the result has the replica axis (size ``rf``) second.
    """
    if rf % tp:
        raise ValueError(f"the replication factor {rf} is not a multiple of tp={tp}")
    x = np.asarray(x)
    dp = rf // tp
    return np.repeat(x.reshape(-1, dp, *x.shape[1:]), tp, axis=1)


def pad_axis(x: np.ndarray, n: int, axis: int) -> np.ndarray:
    """``x`` zero-padded at the end of ``axis`` to size ``n``."""
    axis = handle_negative_axis(x, axis)
    widths = [(0, 0)] * np.ndim(x)
    widths[axis] = (0, n - np.shape(x)[axis])
    return np.pad(x, widths)


def squeeze_safe(x: np.ndarray, axis: int | Sequence[int] | None = None) -> np.ndarray:
    """``np.squeeze`` that leaves axes of size other than 1 in place instead of raising."""
    x = np.asarray(x)
    axes = range(x.ndim) if axis is None else [axis] if isinstance(axis, int) else axis
    drop = tuple(a for a in (handle_negative_axis(x, a) for a in axes) if x.shape[a] == 1)
    return np.squeeze(x, drop)
