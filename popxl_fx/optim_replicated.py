"""The optimizer update of a replicated program: data parallel, and with RTS.

With ``replicas > 1`` every replica computes the gradients of its own share of the batch. The
update then makes the replicas agree:

- data parallel: each gradient is mean all-reduced (``replicated_all_reduce(g, "mean")``: the
  replicas' gradients added in replica order, then divided by the replica count) and every
  replica applies the same update to its own copy of the weights and optimizer state. For a
  loss that is a mean over the batch this is the gradient of the whole batch's mean loss, up to
  the order of the float32 sums (a replica's mean, then the mean over replicas);
- replicated tensor sharding (``sharded=True``): each replica keeps only its shard of the
  optimizer state (`addons.rts.replica_sharded_spec`: the flattened tensor zero-padded to
  ``ceil(n / replicas)`` elements per replica). The gradient is reduce-scattered with "mean"
  (`addons.rts.reduce_replica_sharded_tensor`), the update runs on this replica's shard of the
  weight (``replica_sharded_slice``) with its shard of the state, and the updated shards are
  all-gathered (`addons.rts.gather_replica_sharded_tensor`) and copied into the full weight.
  The update is elementwise, so every element gets the same arithmetic as without sharding and
  the result is bit for bit the data-parallel update; padding elements start and stay zero
  and are dropped by the gather.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import addons
import popxl_core as popxl
from popxl_core import ops

__all__ = ["Replication"]


@dataclass(frozen=True)
class Replication:
    """How an optimizer update is replicated: ``replicas`` data-parallel copies, optimizer
    state ``sharded`` across them (RTS) or not."""

    replicas: int = 1
    sharded: bool = False

    def __post_init__(self) -> None:
        if self.sharded and self.replicas < 2:
            raise ValueError("Replication(sharded=True) needs replicas >= 2.")

    @property
    def active(self) -> bool:
        return self.replicas > 1

    def reduce_gradient(self, grad: popxl.Tensor) -> popxl.Tensor:
        """``grad`` reduced over the replicas: mean all-reduced, or with RTS reduce-scattered
        into this replica's ``ceil(n/R)``-element shard (mean)."""
        if not self.active:
            return grad
        if not self.sharded:
            return ops.collectives.replicated_all_reduce(grad, "mean")
        return addons.rts.reduce_replica_sharded_tensor(grad, "mean")

    def target(self, param: popxl.Tensor) -> popxl.Tensor:
        """What the update of ``param`` works on: the weight, or with RTS this replica's
        shard of it (the gradient is a shard then too)."""
        if not self.sharded or param.meta_shape:  # a shard already (phased: loaded shard)
            return param
        return ops.collectives.replica_sharded_slice(param)

    def write_back(self, param: popxl.Variable, target: popxl.Tensor) -> None:
        """After a sharded update: the gathered weight into every replica's full copy."""
        if target is param:
            return
        ops.var_updates.copy_var_update_(param, addons.rts.gather_replica_sharded_tensor(target))

    def state_variable(
        self, data: np.ndarray, dtype: popxl.dtype, name: str, scalar_count: bool = False
    ) -> tuple[popxl.Variable, popxl.Tensor]:
        """A state variable with initial value ``data`` (full shape): ``(the variable the
        Session reads and writes in full, the tensor the update works on)``. Sharded with RTS,
        except a step count (``scalar_count``), which every replica keeps whole."""
        if not self.sharded or scalar_count:
            var = popxl.variable(data, dtype, name=name)
            return var, var
        return popxl.replica_sharded_variable(data, dtype, name=name)
