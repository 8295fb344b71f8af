"""Tensor-parallel cross entropy over logits sharded along the class axis (popxl.addons'
``cross_entropy_sharded_loss``).

Each replica of ``replica_grouping`` holds ``(n_samples, n_classes / tp)`` logits and the same
``(n_samples,)`` indices, already shifted by its shard's first class (so a label outside
``[0, n_classes / tp)`` belongs to another shard). The loss, identical on every replica, is
``logsumexp(all logits) - logit[label]``, made here from table ops and two all-reduces (their
gradients pass through unchanged: the loss gradient is identical on the group), plus an
all-reduce max for the shift that makes the exponentials safe (no gradient: it cancels).
"""

from __future__ import annotations

from typing import Optional

import numpy as np

import popxl_core as popxl
from popxl_core import ReplicaGrouping, Tensor, ops
from popxl_core.ops.collectives import replicated_all_reduce

from .replicated_all_reduce_TP.replicated_all_reduce_TP import _all_reduce_identity_grad

__all__ = ["cross_entropy_sharded_loss"]

_REDUCTIONS = ("mean", "sum", "none")


def _label_logit(logits: Tensor, indices: Tensor) -> Tensor:
    """``logits[i, indices[i]]`` where the index is in this shard's range, else 0."""
    n_local = logits.shape[-1]
    idx = ops.cast(indices, popxl.int32)
    zero, top = popxl.constant(0, popxl.int32), popxl.constant(n_local, popxl.int32)
    here = ops.logical_and(ops.greater_equal(idx, zero), ops.less(idx, top))
    safe = ops.where(here, idx, zero)
    values = popxl.constant(np.array([0, 1], logits.dtype.as_numpy()), logits.dtype)
    hot = ops.onehot(safe, popxl.constant(n_local, popxl.int32), values, axis=-1)
    mask = ops.cast(here, logits.dtype).reshape((*idx.shape, 1))
    return ops.sum(logits * hot * mask, axis=-1)


def cross_entropy_sharded_loss(
    logits: Tensor,
    indices: Tensor,
    ignore_index: Optional[Tensor] = None,
    replica_grouping: Optional[ReplicaGrouping] = None,
    reduction: str = "mean",
    available_memory_proportion: float = 0.4,
) -> Tensor:
    """Cross entropy of class-sharded ``logits`` (n_samples, n_classes / tp) against
    ``indices`` (n_samples,), reduced by ``reduction``; identical on every replica of the group.

    ``ignore_index`` (shifted like the indices): samples with that label count for nothing
    (and are left out of the mean). ``available_memory_proportion`` only tunes the IPU's
    multi-slice, so it changes no number here.
    """
    if reduction not in _REDUCTIONS:
        raise ValueError(
            f"`reduction` should be one of {', '.join(_REDUCTIONS)}; got {reduction!r}"
        )
    group = replica_grouping if replica_grouping is not None else logits.ir.replica_grouping()
    top = replicated_all_reduce(ops.max(ops.detach(logits), axis=-1, keepdims=True), "max", group)
    shifted = logits - top
    sum_exp = ops.sum(ops.exp(shifted), axis=-1)
    # Graphcore's op is one C++ op with its own gradient: no pattern to run on ours either
    total = _all_reduce_identity_grad(sum_exp, "add", group)
    picked = _all_reduce_identity_grad(_label_logit(shifted, indices), "add", group)
    loss = ops.log(total) - picked
    if ignore_index is not None:
        mask = ops.cast(ops.logical_not(ops.equal(indices, ignore_index)), loss.dtype)
        loss = loss * mask
        if reduction == "mean":
            return ops.sum(loss) / ops.sum(mask)
    if reduction == "mean":
        return ops.mean(loss)
    return ops.sum(loss) if reduction == "sum" else loss
