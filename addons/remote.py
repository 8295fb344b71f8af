"""Remote (Streaming Memory) buffers for named variables, and graphs that load or store a
whole tree of them at one entry (phased execution keeps each layer's variables remote and
loads them only for its phase)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Optional, Union

import numpy as np

import popxl_core
from popxl_core import Tensor, TensorSpec, ops
from popxl_core.dtypes import int32

from .dot_tree import DotTree
from .graph import GraphWithNamedArgs
from .named_tensors import NamedTensors
from .variable_factory import NamedVariableFactories, VariableFactory

__all__ = [
    "NamedRemoteBuffers",
    "create_remote_buffer",
    "named_buffers",
    "named_variable_buffers",
    "load_remote_graph",
    "store_remote_graph",
    "load_remote",
    "store_remote",
]

ShardOver = Union[Mapping, int, bool]


class NamedRemoteBuffers(DotTree):
    """Remote buffers addressed by dotted names (the keys of the variables they hold)."""


def create_remote_buffer(
    spec: TensorSpec, entries: int = 1, replica_group=None, shard_over: Optional[int] = None
):
    """A remote buffer for tensors like ``spec``; replica-sharded when ``shard_over`` > 1
    (each entry then holds a flat shard of ``ceil(nelms / shard_over)`` elements)."""
    shape = tuple(spec.meta_shape or spec.shape)
    if shard_over is not None and shard_over > 1:
        return popxl_core.replica_sharded_buffer(
            shape,
            spec.dtype,
            replica_grouping=replica_group,
            shard_over=shard_over,
            entries=entries,
        )
    return popxl_core.remote_buffer(shape, spec.dtype, entries)


def named_buffers(tensors: NamedTensors, entries: int = 1) -> NamedRemoteBuffers:
    """One remote buffer per tensor (sharded like the tensor if it has a meta shape)."""
    bufs = {}
    for key, t in tensors.to_dict().items():
        shard = _shards_of(t.spec)
        bufs[key] = create_remote_buffer(t.spec, entries, shard_over=shard)
    return NamedRemoteBuffers.from_dict(bufs)


def named_variable_buffers(
    factories: NamedVariableFactories,
    entries: int = 1,
    shard_over_dict: ShardOver = True,
    sharded_threshold: Optional[int] = None,
) -> NamedRemoteBuffers:
    """One remote buffer per variable factory, with ``entries`` entries.

    Args:
        shard_over_dict: how many replicas each buffer is sharded over: ``True`` = the
            factory's whole replica group, ``False``/1 = none, an int for all, or a mapping
            ``{key: n}`` (missing keys: none).
        sharded_threshold: (older addons API, used by the phased-execution tutorial) shard
            over all replicas exactly the variables with at least this many elements.
    """
    bufs = {}
    for key, f in factories.to_dict().items():
        n = _shard_count(key, f, shard_over_dict, sharded_threshold)
        spec = TensorSpec(f.data_shape, f.dtype)
        group = f.replica_grouping if n > 1 else None
        bufs[key] = create_remote_buffer(spec, entries, group, n)
    return NamedRemoteBuffers.from_dict(bufs)


def _shard_count(key: str, f: VariableFactory, shard_over: ShardOver, threshold) -> int:
    if f.replica_sharded:
        return f.shard_over  # a sharded factory fixes its own shard count
    if threshold is not None:
        ir = popxl_core.gcg().ir
        big = int(np.prod(f.data_shape, dtype=np.int64)) >= threshold
        return ir.replication_factor if big else 1
    if isinstance(shard_over, bool):
        return f.replica_grouping.group_size if shard_over else 1
    if isinstance(shard_over, int):
        return shard_over
    if isinstance(shard_over, Mapping):
        return int(shard_over.get(key, 1))
    raise TypeError(
        f"named_variable_buffers: shard_over_dict must be a bool, an int or a mapping, got "
        f"{type(shard_over).__name__}."
    )


def _shards_of(spec: TensorSpec) -> int:
    if not spec.meta_shape:
        return 1
    full = int(np.prod(spec.meta_shape, dtype=np.int64))
    return max(1, -(-full // max(1, spec.nelms)))


def _buffers_sorted(buffers: DotTree, entries: int):
    items = sorted(buffers.to_dict().items(), key=lambda kv: kv[0])
    for _, buf in items:
        buf.entries = max(buf.entries, entries)
    return items


def load_remote_graph(
    buffers: NamedRemoteBuffers, entries: int = 1, use_io_tiles: bool = False
) -> tuple[GraphWithNamedArgs, list[str]]:
    """A graph ``load_remote(load_index)`` loading every buffer's entry ``load_index``.

    Outputs are in sorted key order, returned as the second value (pack them with
    ``NamedTensors.pack(names, graph.call(i))``). Buffers grow to at least ``entries``.
    """
    items = _buffers_sorted(buffers, entries)
    graph = popxl_core.gcg().ir.create_empty_graph("load_remote")
    with graph, popxl_core.in_sequence(False):
        index = popxl_core.graph_input((), int32, "load_index")
        for name, buf in items:
            popxl_core.graph_output(_load(buf, index, name, use_io_tiles))
    return GraphWithNamedArgs(graph), [name for name, _ in items]


def store_remote_graph(
    buffers: NamedRemoteBuffers, entries: int = 1, use_io_tiles: bool = False
) -> GraphWithNamedArgs:
    """A graph ``store_remote(store_index)`` storing its named args (one per buffer key) to
    entry ``store_index``; bind it to the tensors to store."""
    items = _buffers_sorted(buffers, entries)
    graph = popxl_core.gcg().ir.create_empty_graph("store_remote")
    args = {}
    with graph, popxl_core.in_sequence(False):
        index = popxl_core.graph_input((), int32, "store_index")
        for name, buf in items:
            t = popxl_core.graph_input(
                buf.tensor_shape, buf.tensor_dtype, name, meta_shape=buf.meta_shape or None
            )
            _store(buf, index, t, use_io_tiles)
            args[name] = t
    return GraphWithNamedArgs(graph, NamedTensors.from_dict(args))


def load_remote(buffers: NamedRemoteBuffers, entry: Union[int, Tensor] = 0) -> NamedTensors:
    """Load entry ``entry`` of every buffer in the current graph."""
    return NamedTensors.from_dict(
        {name: ops.remote_load(buf, entry, name) for name, buf in _buffers_sorted(buffers, 1)}
    )


def store_remote(
    buffers: NamedRemoteBuffers, tensors: NamedTensors, entry: Union[int, Tensor] = 0
) -> None:
    """Store each tensor of ``tensors`` to entry ``entry`` of the buffer with the same key."""
    bufs = buffers.to_dict()
    for name, t in tensors.to_dict().items():
        if name not in bufs:
            raise KeyError(f"store_remote: no remote buffer for {name!r} (buffers: {list(bufs)}).")
        ops.remote_store(bufs[name], entry, t)


def _load(buf, index: Tensor, name: str, io: bool) -> Tensor:
    if not io:
        return ops.remote_load(buf, index, name)
    idx = ops.io_tile_copy(index)
    with popxl_core.io_tiles():
        t = ops.remote_load(buf, idx, name)
    return ops.io_tile_copy(t)


def _store(buf, index: Tensor, t: Tensor, io: bool) -> None:
    if not io:
        ops.remote_store(buf, index, t)
        return
    idx, t_io = ops.io_tile_copy(index), ops.io_tile_copy(t)
    with popxl_core.io_tiles():
        ops.remote_store(buf, idx, t_io)
