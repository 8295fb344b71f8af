"""`NamedReplicaGrouping`: a replica grouping per dotted name (for factories, accumulators)."""

from __future__ import annotations

import json
import os
from typing import Iterable, Optional

from popxl_core import ReplicaGrouping, gcg

from .dot_tree import DotTree

__all__ = [
    "NamedReplicaGrouping",
    "fill_none_group",
    "get_instance_replica_grouping",
    "get_ild_replica_grouping",
    "get_ild_size_from_popdist",
    "is_cross_instance",
    "is_cross_ild",
]


def fill_none_group(rg: Optional[ReplicaGrouping], none_value: ReplicaGrouping) -> ReplicaGrouping:
    """``rg``, or ``none_value`` where ``rg`` is None."""
    return none_value if rg is None else rg


def _restricted(rg: Optional[ReplicaGrouping], size: int, what: str) -> ReplicaGrouping:
    """``rg`` (default: all replicas) cut down to the replicas of one block of ``size``
    consecutive replicas, keeping its stride."""
    ir = gcg().ir
    rg = rg or ir.replica_grouping()
    if rg.stride > size:
        raise ValueError(f"replica grouping stride {rg.stride} must be at most the {what} {size}.")
    if rg.group_size * rg.stride > size:
        return ir.replica_grouping(stride=rg.stride, group_size=size // rg.stride)
    return rg


def is_cross_instance(rg: ReplicaGrouping) -> bool:
    """Whether a group of ``rg`` spans more than one instance's replicas."""
    return rg.group_size * rg.stride > gcg().ir.instance_replication_factor


def get_instance_replica_grouping(rg: Optional[ReplicaGrouping] = None) -> ReplicaGrouping:
    """``rg`` (default: all replicas) restricted to the replicas of one instance."""
    return _restricted(rg, gcg().ir.instance_replication_factor, "instance replication factor")


def get_ild_size_from_popdist() -> int:
    """The IPU-Link domain size: ``ipuLinkDomainSize`` of ``POPLAR_TARGET_OPTIONS``, else the
    replication factor up to 64 (one domain of a POD64)."""
    size = json.loads(os.environ.get("POPLAR_TARGET_OPTIONS", "{}")).get("ipuLinkDomainSize")
    return int(size) if size is not None else min(gcg().ir.replication_factor, 64)


def is_cross_ild(rg: ReplicaGrouping) -> bool:
    """Whether a group of ``rg`` spans more than one IPU-Link domain."""
    return rg.group_size * rg.stride > get_ild_size_from_popdist()


def get_ild_replica_grouping(rg: Optional[ReplicaGrouping] = None) -> ReplicaGrouping:
    """``rg`` (default: all replicas) restricted to the replicas of one IPU-Link domain."""
    return _restricted(rg, get_ild_size_from_popdist(), "IPU-Link domain size")


class NamedReplicaGrouping(DotTree[ReplicaGrouping]):
    """A `DotTree` of `ReplicaGrouping` leaves, keyed like the variables they group.

    >>> import popxl_core
    >>> ir = popxl_core.Ir(replication=4)
    >>> g = ir.replica_grouping(group_size=2)
    >>> NamedReplicaGrouping.build_groups(["fc.weight", "fc.bias"], g).keys_flat()
    ['fc.weight', 'fc.bias']
    """

    @classmethod
    def build_groups(cls, names: Iterable[str], value: ReplicaGrouping) -> "NamedReplicaGrouping":
        """The same grouping ``value`` for every name in ``names``."""
        if not isinstance(value, ReplicaGrouping):
            raise TypeError(f"build_groups: value must be a ReplicaGrouping, got {value!r}.")
        return cls.from_dict({name: value for name in names})
