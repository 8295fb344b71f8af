"""`NamedReplicaGrouping`: a replica grouping per dotted name (for factories, accumulators)."""

from __future__ import annotations

from typing import Iterable

from popxl_core import ReplicaGrouping

from .dot_tree import DotTree

__all__ = ["NamedReplicaGrouping"]


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
