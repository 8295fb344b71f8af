"""Optimizer state in Streaming Memory, for phased execution.

With ``Options(phased_execution=...)`` each optimizer state tensor (SGD momentum, Adam's
moments and step count) lives in a remote buffer of its own: the update of a phase loads the
state it needs, updates it on chip and stores it back (`RemoteState.store`), so only one
phase's state is on chip at a time. With replicated tensor sharding each replica's buffer
holds its ``ceil(n/R)``-element shard (`popxl_core.remote_replica_sharded_variable`), as the
on-chip sharded state does (`optim_replicated`).
"""

from __future__ import annotations

import numpy as np

import popxl_core as popxl
from popxl_core import ops

from .optim_replicated import Replication

__all__ = ["RemoteState"]


class RemoteState:
    """Where `OptimizerProgram` puts its state when phased: remote buffers, loaded per use."""

    def __init__(self, replication: Replication) -> None:
        self.replication = replication
        self._pending: list[tuple[popxl.RemoteBuffer, popxl.Tensor]] = []

    def state_variable(
        self, data: np.ndarray, dtype: popxl.dtype, name: str, scalar_count: bool = False
    ) -> tuple[popxl.Variable, popxl.Tensor]:
        """``(the remote variable the Session reads and writes in full, its value loaded on
        chip now)``; the loaded value is stored back by the next `store`."""
        sharded = self.replication.sharded and not scalar_count
        shape = tuple(data.shape)
        if sharded:
            buf = popxl.replica_sharded_buffer(shape, dtype, shard_over=self.replication.replicas)
            var = popxl.remote_replica_sharded_variable(data, buf, 0, dtype, name)
        else:
            buf = popxl.remote_buffer(shape, dtype, 1)
            var = popxl.remote_variable(data, buf, 0, dtype, name)
        loaded = ops.remote_load(buf, 0, name)
        self._pending.append((buf, loaded))
        return var, loaded

    def store(self) -> None:
        """Store every state tensor loaded since the last call back to its buffer."""
        for buf, t in self._pending:
            ops.remote_store(buf, 0, t)
        self._pending.clear()
