"""popxl.ops.collectives: collectives across replicas (all-reduce, reduce-scatter,
all-gather) and the replica-sharded slices used by replicated tensor sharding."""

from .collectives import CollectiveOps, to_collective_op
from .replicated import (
    replica_sharded_slice,
    replicated_all_gather,
    replicated_all_reduce,
    replicated_all_reduce_,
    replicated_reduce_scatter,
    replicated_slice,
)

__all__ = [
    "CollectiveOps",
    "to_collective_op",
    "replicated_all_reduce",
    "replicated_all_reduce_",
    "replicated_reduce_scatter",
    "replicated_all_gather",
    "replica_sharded_slice",
    "replicated_slice",
]
