"""Replicated tensor sharding (RTS): each replica keeps a flat 1/R shard of a tensor, padded to
``ceil(nelms / R)`` elements; graphs that gather the shards into full tensors and reduce full
tensors (gradients) back into shards."""

from __future__ import annotations

import math
from typing import Optional

import popxl_core
from popxl_core import Tensor, TensorSpec, ops

from .dot_tree import DotTree
from .graph import GraphWithNamedArgs
from .named_tensors import NamedTensors

__all__ = [
    "replica_sharded_spec",
    "gather_replica_sharded_tensor",
    "all_gather_replica_sharded_graph",
    "reduce_replica_sharded_tensor",
    "reduce_replica_sharded_graph",
]


def _whole_ir_group():
    return popxl_core.gcg().ir.replica_grouping()


def replica_sharded_spec(t: Tensor, shard_over=None, threshold: Optional[int] = None) -> TensorSpec:
    """The spec of ``t``'s replica shard: ``(ceil(nelms / group_size),)`` with meta shape
    ``t.shape``; ``t.spec`` itself if ``t`` is already sharded, the group has one replica, or
    (older addons API) ``t`` has fewer than ``threshold`` elements.

    Args:
        shard_over: the ReplicaGrouping to shard over (default: all replicas).
    """
    if t.meta_shape:
        return t.spec
    group = shard_over if shard_over is not None else _whole_ir_group()
    if group.group_size == 1 or (threshold is not None and t.nelms < threshold):
        return t.spec
    return TensorSpec((math.ceil(t.nelms / group.group_size),), t.dtype, tuple(t.shape))


def _is_shardable(t: Tensor, group, threshold: Optional[int]) -> bool:
    return group.group_size > 1 and (threshold is None or t.nelms >= threshold)


def gather_replica_sharded_tensor(
    t: Tensor, use_io_tiles: bool = False, replica_group=None
) -> Tensor:
    """The full tensor from its shards (``t`` unchanged, copied, if it is not sharded)."""
    if not t.meta_shape:
        return ops.identity(t)
    group = replica_group if replica_group is not None else _whole_ir_group()
    if use_io_tiles:
        with popxl_core.io_tiles():
            full = ops.collectives.replicated_all_gather(ops.io_tile_copy(t), group=group)
        return ops.io_tile_copy(full)
    return ops.collectives.replicated_all_gather(t, group=group)


def reduce_replica_sharded_tensor(
    t: Tensor,
    op: str = "add",
    replica_group=None,
    shard_group=None,
    threshold: Optional[int] = None,
) -> Tensor:
    """Reduce ``t`` across replicas: reduce-scattered into a shard over ``shard_group`` when
    that has more than one replica (and ``t`` reaches ``threshold``), else all-reduced over
    ``replica_group``."""
    shard = shard_group if shard_group is not None else _whole_ir_group()
    if _is_shardable(t, shard, threshold):
        return ops.collectives.replicated_reduce_scatter(
            t, op, group=shard, configure_output_for_replicated_tensor_sharding=True
        )
    group = replica_group if replica_group is not None else _whole_ir_group()
    return ops.collectives.replicated_all_reduce(t, op, group=group)


def _group_for(groups, key: str):
    if groups is None:
        return None
    if isinstance(groups, DotTree):
        return groups.get(key) if key in groups else None
    return groups


def all_gather_replica_sharded_graph(
    tensors: NamedTensors, use_io_tiles: bool = False, replica_groups=None
) -> tuple[GraphWithNamedArgs, list[str]]:
    """A graph whose named inputs are ``tensors``' specs and whose outputs are the gathered
    tensors, in sorted key order (the names are returned second)."""
    items = sorted(tensors.to_dict().items(), key=lambda kv: kv[0])
    graph = popxl_core.gcg().ir.create_empty_graph("all_gather")
    args = {}
    with graph, popxl_core.in_sequence(False):
        for key, t in items:
            x = popxl_core.graph_input(t.shape, t.dtype, key, meta_shape=t.meta_shape or None)
            args[key] = x
            group = _group_for(replica_groups, key)
            popxl_core.graph_output(gather_replica_sharded_tensor(x, use_io_tiles, group))
    return GraphWithNamedArgs(graph, NamedTensors.from_dict(args)), [k for k, _ in items]


def reduce_replica_sharded_graph(
    tensors: NamedTensors,
    op: str = "add",
    use_io_tiles: bool = False,
    shard_groups=None,
    replica_group=None,
    threshold: Optional[int] = None,
) -> tuple[GraphWithNamedArgs, list[str]]:
    """A graph reducing each named input across replicas (see
    `reduce_replica_sharded_tensor`); outputs in sorted key order, names returned second.

    ``threshold`` is the older addons API the phased-execution tutorial uses: only tensors
    with at least that many elements are sharded.
    """
    items = sorted(tensors.to_dict().items(), key=lambda kv: kv[0])
    graph = popxl_core.gcg().ir.create_empty_graph("reduce_replica_sharded")
    args = {}
    with graph, popxl_core.in_sequence(False):
        for key, t in items:
            x = popxl_core.graph_input(t.shape, t.dtype, key, meta_shape=t.meta_shape or None)
            args[key] = x
            y = _reduce(
                x, op, replica_group, _group_for(shard_groups, key), threshold, use_io_tiles
            )
            popxl_core.graph_output(y)
    return GraphWithNamedArgs(graph, NamedTensors.from_dict(args)), [k for k, _ in items]


def _reduce(x, op, replica_group, shard_group, threshold, io: bool) -> Tensor:
    if not io:
        return reduce_replica_sharded_tensor(x, op, replica_group, shard_group, threshold)
    with popxl_core.io_tiles():
        y = reduce_replica_sharded_tensor(
            ops.io_tile_copy(x), op, replica_group, shard_group, threshold
        )
    return ops.io_tile_copy(y)
