"""Variables that live in Streaming Memory: remote variables, replica-sharded (RTS) variables.

A remote variable is a main-graph `Variable` whose device value is one entry of a
`RemoteBuffer` on every replica; programs move it on chip with ``ops.remote_load``. A
replica-sharded one stores on each replica only its shard: the flattened value, zero-padded to
a multiple of ``shard_over`` and cut into ``shard_over`` pieces of ``ceil(nelms / shard_over)``
elements. Session.get_tensor_data / write_variable_data always see the full value.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from math import ceil, prod
from typing import Optional, Tuple

import numpy as np

from . import dtypes
from .context import gcg
from .planning import weightless
from .remote_buffer import RemoteBuffer, replica_sharded_buffer
from .tensor import TensorSpec, Variable, variable
from .tensor_data import grouped_data, host_array

__all__ = [
    "RemoteInfo",
    "remote_variable",
    "remote_replica_sharded_variable",
    "replica_sharded_variable",
    "remote_info",
    "shard_source",
]


@dataclass(frozen=True)
class RemoteInfo:
    """Where a remote variable lives: ``buffer`` entry ``offset``, sharded ``shard_over`` ways
    (1: not sharded)."""

    buffer: RemoteBuffer
    offset: int
    shard_over: int = 1


def remote_info(v) -> Optional[RemoteInfo]:
    """The `RemoteInfo` of a remote variable; None for any other tensor."""
    return getattr(v, "_remote", None)


def shard_source(v) -> Optional[Variable]:
    """For the on-chip shard returned by `replica_sharded_variable`: its remote variable."""
    return getattr(v, "_shard_of", None)


def _check_buffer(buffer, offset: int, who: str) -> None:
    if not isinstance(buffer, RemoteBuffer):
        raise TypeError(f"{who}: remote_buffer must be a popxl.RemoteBuffer, got {buffer!r}.")
    if not isinstance(offset, int):
        raise TypeError(f"{who}: offset must be an int, got {type(offset).__name__}.")
    buffer.check_offset(offset)


def remote_variable(
    data,
    remote_buffer: RemoteBuffer,
    offset: int = 0,
    dtype=None,
    name: Optional[str] = None,
    downcast: bool = True,
    replica_grouping=None,
    retrieval_mode: str = "one_per_group",
    log2_scale=None,
    nan_on_overflow=None,
) -> Variable:
    """A variable stored in entry ``offset`` of ``remote_buffer`` (load it with
    ``ops.remote_load``); the buffer must hold the variable's shape and dtype."""
    _check_buffer(remote_buffer, offset, f"remote_variable({name!r})")
    arr, spec = _host_spec(data, dtype, downcast, replica_grouping, log2_scale, nan_on_overflow)
    one_group = replica_grouping is None or replica_grouping.num_groups == 1
    if one_group and spec.shape[:1] == (1,) and spec.shape[1:] == remote_buffer.tensor_shape:
        # PopXL accepts a leading dim of 1 for a single replica group
        arr, spec = arr[0], TensorSpec(spec.shape[1:], spec.dtype)
    _check_entry(remote_buffer, name or "t", spec)
    v = variable(arr, spec.dtype, name, False, replica_grouping, retrieval_mode)
    v._remote = RemoteInfo(remote_buffer, offset, 1)
    return v


def _check_entry(buffer: RemoteBuffer, name: str, spec: TensorSpec) -> None:
    """ValueError unless ``spec`` fits one entry of ``buffer``, or is larger with its dtype.

    PopXL's `remote_variable` does not compare the variable with the buffer, and PopART
    streams one entry's bytes from the start of the variable's host data (Poplar's
    copyToRemoteBuffer) and back: a larger variable runs, its leading elements in the entry
    (popart's test_d2hWeightBuffer_elision builds one). A smaller one, or one of another dtype,
    would have Poplar read past or reinterpret the host data, so it stays refused."""
    entry = prod(buffer.tensor_shape)
    if spec.dtype is not buffer.tensor_dtype or prod(spec.shape) <= entry:
        buffer.check_spec(name, spec.shape, spec.dtype)
        return
    warnings.warn(
        f"remote_variable({name!r}): {tuple(spec.shape)} does not match remote buffer "
        f"{buffer.remote_buffer_id}, which holds {buffer.tensor_shape}. As PopART streams "
        f"it, the entry holds the variable's first {entry} elements (C order), and only those "
        "are read back to the host.",
        stacklevel=3,
    )


def _shard_over(buffer: RemoteBuffer, replica_grouping, ir) -> int:
    if buffer._shard_over is not None:
        return buffer._shard_over
    return ir.replication_factor if replica_grouping is None else replica_grouping.group_size


def remote_replica_sharded_variable(
    data,
    remote_buffer: RemoteBuffer,
    offset: int = 0,
    dtype=None,
    name: Optional[str] = None,
    downcast: bool = True,
    replica_grouping=None,
    retrieval_mode: str = "one_per_group",
    log2_scale=None,
    nan_on_overflow=None,
) -> Variable:
    """A variable whose replicas each store one shard in entry ``offset`` of
    ``remote_buffer``; ``ops.remote_load`` gives the shard (``meta_shape`` = full shape)."""
    who = f"remote_replica_sharded_variable({name!r})"
    _check_buffer(remote_buffer, offset, who)
    arr, spec = _host_spec(data, dtype, downcast, replica_grouping, log2_scale, nan_on_overflow)
    shards = _shard_over(remote_buffer, replica_grouping, gcg().ir)
    _fit_full_shape_buffer(remote_buffer, spec, shards, who)
    remote_buffer.check_spec(name or "t", spec.shape, spec.dtype, shards, sharded=True)
    v = variable(arr, spec.dtype, name, False, replica_grouping, retrieval_mode)
    # a buffer made with the grouped data's shape (num_groups, *shape) holds shards of one
    # group's value, as PopXL takes it: its meta shape is the variable's
    if not remote_buffer.meta_shape or remote_buffer.meta_shape == arr.shape != v.shape:
        remote_buffer.meta_shape = v.shape
    v._remote = RemoteInfo(remote_buffer, offset, shards)
    return v


def _fit_full_shape_buffer(buffer: RemoteBuffer, spec, shards: int, who: str) -> None:
    """PopXL accepts a buffer made with the variable's full shape for a replica-sharded
    variable (it does not compare them); each replica stores one shard, so the buffer's entries
    become the shard's shape, as replica_sharded_buffer would have made them."""
    entry = (ceil(prod(spec.shape) / shards),)
    if shards > 1 and buffer.tensor_shape == tuple(spec.shape) != entry:
        if buffer.tensor_dtype is spec.dtype:
            warnings.warn(
                f"{who}: remote buffer {buffer.remote_buffer_id} was made with the full shape "
                f"{tuple(spec.shape)}; each of the {shards} replicas stores a shard of {entry}, "
                f"so its entries now hold {entry} (popxl.replica_sharded_buffer makes such a "
                "buffer).",
                stacklevel=3,
            )
            buffer.set_remote_buffer_info(spec.dtype, entry, buffer.entries)


def replica_sharded_variable(
    data,
    dtype=None,
    name: Optional[str] = None,
    downcast: bool = True,
    replica_grouping=None,
    shard_over: Optional[int] = None,
    retrieval_mode: str = "one_per_group",
    log2_scale=None,
    nan_on_overflow=None,
) -> Tuple[Variable, Variable]:
    """A replica-sharded variable and its on-chip shard.

    Returns ``(var, shard)``: ``var`` is the remote variable (read and write it through the
    Session with its full shape); ``shard`` holds this replica's piece on chip, loaded when
    weights go to the device and stored back when they return to the host.
    """
    arr, spec = _host_spec(data, dtype, downcast, replica_grouping, log2_scale, nan_on_overflow)
    shape, dt = spec.shape, spec.dtype
    buf = replica_sharded_buffer(shape, dt, replica_grouping, shard_over)
    var = remote_replica_sharded_variable(
        arr, buf, 0, dt, name, False, replica_grouping, retrieval_mode
    )
    g = var.graph
    spec = TensorSpec(buf.tensor_shape, dt, tuple(shape))
    shard = Variable._create(g, g._create_tensor_id(f"{var.name}_shard"), spec)
    shard._data = np.zeros(buf.tensor_shape, dt.as_numpy())
    shard._replica_grouping = None
    shard._retrieval_mode = "one_per_group"
    shard._shard_of = var
    return var, shard


def _host_spec(
    data, dtype, downcast: bool, replica_grouping, log2_scale=None, nan_on_overflow=None
) -> Tuple[np.ndarray, TensorSpec]:
    """The host array and the on-device spec a variable made from ``data`` would have
    (float8 data converted as `popxl.variable` converts it)."""
    data = grouped_data(data, replica_grouping, "remote variable data")
    if gcg().ir.planning:  # shape and dtype only (popxl_core.planning)
        data = weightless(data)
    arr, dtype = host_array(
        data, dtype, downcast, log2_scale, nan_on_overflow, "remote variable data"
    )
    groups = replica_grouping.num_groups if replica_grouping is not None else 1
    shape = arr.shape[1:] if groups > 1 else arr.shape
    return arr, TensorSpec(shape, dtype or dtypes.dtype.as_dtype(arr))
