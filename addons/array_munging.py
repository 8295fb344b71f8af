"""numpy helpers that lay host data out per replica: shards, repeats, padding."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Optional, Union

import numpy as np

__all__ = [
    "shard",
    "unshard_arrays",
    "unshard",
    "repeat",
    "repeat_axis",
    "split2D",
    "shard2D",
    "unshard2D",
    "repeat_shard",
    "tensor_parallel_input",
    "tensor_parallel_output",
    "pad_axis",
    "squeeze_safe",
    "handle_negative_axis",
]


def handle_negative_axis(x: np.ndarray, axis: int) -> int:
    """``axis`` as a non-negative axis of ``x``; IndexError if ``x`` has no such axis."""
    nd = np.ndim(x)
    if not -nd <= axis < nd:
        raise IndexError(f"axis {axis} is out of range for an array of {nd} dimensions.")
    return axis % nd


def shard(x: np.ndarray, n: int, axis: int) -> np.ndarray:
    """``x`` split into ``n`` equal pieces along ``axis``, stacked on a new axis 0."""
    return np.stack(np.split(np.asarray(x), n, axis=axis))


def unshard_arrays(arrays: Iterable[np.ndarray], axis: int) -> np.ndarray:
    """The pieces of `shard` joined back along ``axis`` of the unsharded array."""
    return np.concatenate(list(arrays), axis=axis)


def unshard(x: np.ndarray, axis: int) -> np.ndarray:
    """The inverse of ``shard(data, n, axis)``: the shards (axis 0) joined along ``axis``."""
    return unshard_arrays(list(np.asarray(x)), axis)


def repeat(x: np.ndarray, n: int, axis: int = 0) -> np.ndarray:
    """``n`` copies of ``x`` along a new axis ``axis`` (e.g. one per replica)."""
    return np.repeat(np.expand_dims(np.asarray(x), axis), n, axis=axis)


def repeat_axis(x: np.ndarray, n: int, axis: int = 0) -> np.ndarray:
    """``n`` copies of ``x`` concatenated along the existing axis ``axis``."""
    return np.concatenate([np.asarray(x)] * n, axis=axis)


def split2D(x: np.ndarray, n1: int, n2: int, axis1: int, axis2: int) -> list:
    """``[[piece]]``: ``x`` split ``n1`` ways along ``axis1``, each split ``n2`` ways along
    ``axis2``."""
    return [np.split(a, n2, axis=axis2) for a in np.split(np.asarray(x), n1, axis=axis1)]


def shard2D(x: np.ndarray, n1: int, n2: int, axis1: int, axis2: int) -> np.ndarray:
    """``n1 * n2`` shards on axis 0; ``axis1`` is the outer split, ``axis2`` the inner."""
    return np.stack([p for row in split2D(x, n1, n2, axis1, axis2) for p in row])


def unshard2D(x: np.ndarray, n1: int, n2: int, axis1: int, axis2: int) -> np.ndarray:
    """The inverse of `shard2D`."""
    x = np.asarray(x)
    rows = [unshard_arrays(x[i * n2 : (i + 1) * n2], axis2) for i in range(n1)]
    return unshard_arrays(rows, axis1)


def repeat_shard(
    x: np.ndarray,
    n_repeats: int,
    n_shards: int,
    shard_axis: int,
    sharded_tensor: str = "contiguous",
) -> np.ndarray:
    """Shards of ``x`` repeated: "contiguous" repeats the shard sequence (s0 s1 s0 s1),
    "strided" repeats each shard in place (s0 s0 s1 s1)."""
    shards = shard(x, n_shards, shard_axis)
    if sharded_tensor == "contiguous":
        return repeat_axis(shards, n_repeats, 0)
    if sharded_tensor == "strided":
        return np.repeat(shards, n_repeats, axis=0)
    raise ValueError(f"sharded_tensor must be 'contiguous' or 'strided', got {sharded_tensor!r}.")


def tensor_parallel_input(x: np.ndarray, tp: int, rf: int) -> np.ndarray:
    """Host data for ``rf`` replicas in ``rf // tp`` data-parallel groups of ``tp`` tensor-parallel
    replicas: each element repeated ``tp`` times (the group shares it), and the result split
    into the data-parallel groups when there is more than one."""
    if rf % tp:
        raise ValueError(f"replication factor {rf} is not a multiple of tensor parallelism {tp}.")
    dp = rf // tp
    out = repeat(x, tp, axis=-1)
    return shard(out, dp, 0).reshape(dp, -1) if dp > 1 else out


def tensor_parallel_output(
    output_data: np.ndarray,
    num_host_transfers: int,
    tp: int,
    rf: int,
    data_shape: Sequence[int],
    tp_identical: bool = True,
    true_num_host_transfers: Optional[int] = None,
) -> np.ndarray:
    """A Session's output ``(num_host_transfers, rf, *data_shape)`` as ``(samples, *data_shape)``
    (``(samples, tp, *data_shape)`` when the ``tp`` replicas of a group give different outputs).

    ``true_num_host_transfers`` drops the transfer slots past that count (left unwritten when a
    stream is stored fewer times a run than the Ir's ``num_host_transfers``).
    """
    if tp > rf or rf % tp:
        raise ValueError(f"tensor parallelism {tp} must divide the replication factor {rf}.")
    out = np.asarray(output_data).reshape(num_host_transfers, rf // tp, tp, *data_shape)
    if true_num_host_transfers is not None:
        out = out[:true_num_host_transfers]
    out = out.reshape(-1, tp, *data_shape)
    return out[:, 0] if tp_identical else out


def pad_axis(x: np.ndarray, n: int, axis: int) -> np.ndarray:
    """``x`` zero-padded at the end of ``axis`` to length ``n``."""
    x = np.asarray(x)
    axis = handle_negative_axis(x, axis)
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, n - x.shape[axis])
    return np.pad(x, widths)


def squeeze_safe(x: np.ndarray, axis: Optional[Union[int, Sequence[int]]] = None) -> np.ndarray:
    """Remove the given axes that have length 1 (all length-1 axes if ``axis`` is None);
    axes longer than 1 are kept rather than raising."""
    x = np.asarray(x)
    if axis is None:
        return np.squeeze(x)
    axes = [axis] if isinstance(axis, int) else list(axis)
    drop = tuple(a for a in (handle_negative_axis(x, a) for a in axes) if x.shape[a] == 1)
    return np.squeeze(x, axis=drop) if drop else x
