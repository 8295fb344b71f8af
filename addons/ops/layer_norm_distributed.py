"""Layer normalisation of a tensor sharded along its hidden axis across a replica group
(popxl.addons' ``layer_norm_distributed``).

The mean and variance are over the whole hidden axis: each replica sums its shard and an
all-reduce adds the sums; the all-reduces' gradients are all-reduced too (every shard's
normalised values depend on every shard's inputs), so the composite's autodiff is the gradient.
"""

from __future__ import annotations

from typing import Optional

from popxl_core import ReplicaGrouping, Tensor, ops
from popxl_core.ops.collectives import replicated_all_reduce

__all__ = ["layer_norm_distributed"]


def layer_norm_distributed(
    t: Tensor,
    w: Tensor,
    b: Tensor,
    epsilon: float = 1e-5,
    group: Optional[ReplicaGrouping] = None,
) -> Tensor:
    """``(t - mean) / sqrt(var + epsilon) * w + b`` over the hidden axis of ``t`` (N, H / tp)
    sharded across ``group`` (default: all replicas); ``w``, ``b``: this shard's (H / tp,)."""
    if t.rank != 2 or w.rank != 1 or b.rank != 1:
        raise ValueError(
            f"layer_norm_distributed takes t (N, H) and w, b (H,); got {t.shape}, {w.shape}, "
            f"{b.shape}."
        )
    group = group if group is not None else t.ir.replica_grouping()
    hidden = t.shape[-1] * group.group_size
    mean = replicated_all_reduce(ops.sum(t, axis=-1, keepdims=True), "add", group) / hidden
    centred = t - mean
    var = replicated_all_reduce(ops.sumsquare(centred, axis=-1, keepdims=True), "add", group)
    inv_std = 1 / ops.sqrt(var / hidden + epsilon)
    return centred * inv_std * w + b
