"""Ring collectives over the replicas, for the cost model (cost.py), keyed by the op's row.

Each collective's module registers how many bytes each replica sends over the IPU-Links, as a
fraction ``factor`` of the op's tensor (``factor x (n-1)/n x bytes`` in a group of ``n``): an
all-reduce 2 (a reduce-scatter then an all-gather), a reduce-scatter or an all-gather 1. A
collective of ``addons`` registers its own row here, so the cost model matches no op type by
its name. A rule is the factor, or a function of the op's attributes giving it where a row's
traffic depends on them (addons' tensor-parallel all-reduce is the identity in one direction:
0, no exchange). Like `speed`, this module imports nothing of the project but `speed`'s table type.
"""

from __future__ import annotations

from .speed import OpTable

__all__ = ["RING_FACTOR"]

RING_FACTOR: OpTable = OpTable("ring_factor")
