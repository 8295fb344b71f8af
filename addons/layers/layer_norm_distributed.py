"""`LayerNormDistributed`: layer norm over a hidden axis sharded across a replica group."""

from __future__ import annotations

from functools import partial
from typing import Optional

import numpy as np

from popxl_core import ReplicaGrouping, Tensor

from ..module import Module
from ..ops.layer_norm_distributed import layer_norm_distributed

__all__ = ["LayerNormDistributed"]


class LayerNormDistributed(Module):
    """Layer norm of ``x`` (N, H / tp) whose hidden axis is sharded across ``replica_grouping``;
    the weight and bias shards (ones and zeros) are grouped by the transposed grouping (each
    shard position its own value, shared by the data-parallel copies)."""

    def __init__(self, replica_grouping: Optional[ReplicaGrouping] = None) -> None:
        super().__init__()
        self.replica_grouping = replica_grouping

    def build(self, x: Tensor, eps: float = 1e-5) -> Tensor:
        group = self.replica_grouping or x.ir.replica_grouping()
        rg = group.transpose()
        w = self.add_variable_input(
            "weight", partial(np.ones, x.shape[-1]), x.dtype, replica_grouping=rg
        )
        b = self.add_variable_input(
            "bias", partial(np.zeros, x.shape[-1]), x.dtype, replica_grouping=rg
        )
        return layer_norm_distributed(x, w, b, epsilon=eps, group=group)
