"""Ring collectives over the replicas, for the cost model (cost.py), keyed by the op's row.

Each collective's module registers how many bytes each replica sends over the IPU-Links, as a
fraction ``factor`` of the op's tensor (``factor x (n-1)/n x bytes`` in a group of ``n``): an
all-reduce 2 (a reduce-scatter then an all-gather), a reduce-scatter or an all-gather 1. A
collective of ``addons`` registers its own row here, so the cost model matches no op type by
its name. A rule is the factor, or a function of the op's attributes giving it where a row's
traffic depends on them (addons' tensor-parallel all-reduce is the identity in one direction:
0, no exchange). A row that computes and all-reduces small partial results in between (addons'
sharded cross entropy and distributed layer norm, one C++ op each in Graphcore's addons) is an
`Exchanges` rule: its compute is its row's ``cost``, its traffic the all-reduces it lists.
`IPU_LINKS` holds the rows that span the IPUs of one replica and exchange between them
(addons' within-replica sharded cross entropy): a function of the op's specs and attributes
giving the bytes sent over the IPU-Links, added to the row's compute.
Like `speed`, this module imports nothing of the project but `speed`'s table type.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from .speed import OpTable

__all__ = ["RING_FACTOR", "Exchanges", "IPU_LINKS"]

RING_FACTOR: OpTable = OpTable("ring_factor")
IPU_LINKS: OpTable = OpTable("ipu_links")


@dataclass(frozen=True)
class Exchanges:
    """The all-reduces inside a computing op: ``sizes(ins, outs, attrs)`` (the op's tensor
    specs and attributes) gives the bytes of each one, in order; each is a ring all-reduce
    over the op's group (factor 2) with its own sync, after the op's compute."""

    sizes: Callable[[Sequence[Any], Sequence[Any], dict], Sequence[int]]
