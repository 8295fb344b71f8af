"""Tensor-parallel cross entropy over logits sharded along the class axis (popxl.addons'
``cross_entropy_sharded_loss``; there one C++ op, ``CrossEntropySharded``, and its grad op).

Each replica of ``replica_grouping`` holds ``(n_samples, n_classes / tp)`` logits and the same
``(n_samples,)`` indices, already shifted by its shard's first class (so a label outside
``[0, n_classes / tp)`` belongs to another shard). The op ``CrossEntropySharded`` computes, as
Graphcore's does, the shard's negative log-softmax with three all-reduces over the group: the
max of the logits (the shift that makes the exponentials safe), the sum of the exponentials,
and the loss ``-log_softmax[label]`` taken on the shard that holds the label (0 elsewhere).
Its outputs: the loss ``(n_samples,)``, identical on the group, and the shard's negative
log-softmax, which the grad op ``CrossEntropyShardedGrad`` reads: ``softmax * dloss`` minus
``dloss`` at the label, with no exchange (the loss gradient is identical on the group).
The ``ignore_index`` mask and the reduction are ordinary ops after it, as in Graphcore's.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F

import popxl_core as popxl
from popxl_core import ReplicaGrouping, Tensor, TensorSpec, ops
from popxl_core.context import gcg
from popxl_core.ops.collectives.collectives import resolve_group
from popxl_core.ops.registry import Cost, OpDef, Sample, create_op, register
from popxl_core.sim.ring import RING_FACTOR, Exchanges

from .exchanging_kernel import exchanging_emit, table_kernel, widened

__all__ = [
    "cross_entropy_sharded_loss",
    "label_values",
    "softmax_grad",
    "CROSS_ENTROPY_SHARDED",
    "CROSS_ENTROPY_SHARDED_GRAD",
]

_REDUCTIONS = ("mean", "sum", "none")
_OUT_NAMES = ["cross_entropy_sharded_out", "cross_entropy_sharded_soft_max_out"]


def _infer(ins, group, available_memory_proportion):
    logits, indices = ins
    if len(logits.shape) != 2 or len(indices.shape) != 1 or logits.shape[0] != indices.shape[0]:
        raise ValueError(
            "cross_entropy_sharded_loss takes logits (n_samples, sharded_n_classes) and "
            f"indices (n_samples,); got {logits.shape} and {indices.shape}"
        )
    if not logits.dtype.is_floating_point or indices.dtype.is_floating_point:
        raise ValueError(
            f"logits must be floating point and indices integers; got {logits.dtype.name} "
            f"and {indices.dtype.name}"
        )
    return [TensorSpec((logits.shape[0],), logits.dtype), logits]


def _on_shard(indices: torch.Tensor, n_local: int):
    """``(index, in_range)``: the labels as gather indices (0 where out of the shard's range,
    which another shard holds) and where they are in range."""
    idx = indices.long()
    here = (idx >= 0) & (idx < n_local)
    return torch.where(here, idx, 0), here


def label_values(neg_log_softmax: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """Each row's value at its label where the shard holds the label, else 0."""
    idx, here = _on_shard(indices, neg_log_softmax.shape[-1])
    picked = neg_log_softmax.gather(1, idx[:, None])[:, 0]
    return torch.where(here, picked, torch.zeros_like(picked))


def softmax_grad(dloss: torch.Tensor, neg_log_softmax: torch.Tensor, indices, exp) -> torch.Tensor:
    """``softmax * dloss``, minus ``dloss`` at each label the shard holds (Graphcore's grouped
    multi-update-add of -1 x dloss), in float32 for narrower inputs."""
    dl = widened(dloss)[:, None]
    grad = exp(-widened(neg_log_softmax)) * dl
    idx, here = _on_shard(indices, grad.shape[-1])
    minus = torch.where(here[:, None], -dl, torch.zeros_like(dl))
    return grad.scatter_add_(1, idx[:, None], minus)


def _kernel(logits, indices, *, exchange, numerics, available_memory_proportion):
    """(loss, negative log-softmax of the shard), with the all-reduces max, add, add."""
    exp, log = table_kernel("Exp", numerics), table_kernel("Log", numerics)
    x = widened(logits)
    shifted = x - exchange(0, torch.amax(x, -1, keepdim=True))
    total = exchange(1, torch.sum(exp(shifted), -1, keepdim=True))
    neg_log_softmax = log(total) - shifted
    loss = exchange(2, label_values(neg_log_softmax, indices))
    return loss.to(logits.dtype), neg_log_softmax.to(logits.dtype)


def _grad(ctx):
    if ctx.grad_output(1) is not None:
        raise NotImplementedError(
            "CrossEntropySharded: no gradient through its negative log-softmax output"
        )
    attrs = {"available_memory_proportion": ctx.attrs["available_memory_proportion"]}
    ins = [ctx.grad_output_or_zero(0), ctx.output(1), ctx.input(1)]
    return [create_op(CROSS_ENTROPY_SHARDED_GRAD, ins, attrs)[0], None]


def _grad_infer(ins, available_memory_proportion):
    dloss, neg_log_softmax, indices = ins
    if tuple(dloss.shape) != (neg_log_softmax.shape[0],) or indices.shape != dloss.shape:
        raise ValueError(
            f"CrossEntropyShardedGrad: dloss {dloss.shape}, negative log-softmax "
            f"{neg_log_softmax.shape} and indices {indices.shape} do not agree"
        )
    return [neg_log_softmax]


def _grad_kernel(dloss, neg_log_softmax, indices, *, available_memory_proportion, exp=None):
    grad = softmax_grad(dloss, neg_log_softmax, indices, exp or table_kernel("Exp", "ipu"))
    return grad.to(neg_log_softmax.dtype)


def _cost(ins, outs, attrs) -> Cost:
    """Max, subtract, exp, sum and log-subtract per logit; the logits read twice."""
    logits = ins[0]
    return Cost(5 * logits.nelms, 3 * logits.nbytes + ins[1].nbytes + outs[0].nbytes)


def _grad_cost(ins, outs, attrs) -> Cost:
    """Negate, exp and scale per logit, then one update per sample."""
    return Cost(3 * outs[0].nelms + ins[0].nelms, sum(s.nbytes for s in (*ins, *outs)))


# against torch on the whole row: a few ulps (the exponentials summed in torch.sum's order,
# not log_softmax's; with the labels' shard and the mean often the same bits)
_ULPS = {"rtol": 3e-7, "atol": 3e-8}


def _reference(x, idx, reduction="mean", ignore=None):
    """torch's cross entropy over all classes (the samples' one shard is the whole tensor)."""
    kw = {"ignore_index": ignore} if ignore is not None else {}
    return F.cross_entropy(x, idx.long(), reduction=reduction, **kw)


def _samples():
    rng = np.random.default_rng(36)
    x = rng.uniform(-3, 3, (6, 10)).astype(np.float32)
    labels = rng.integers(0, 10, 6).astype(np.int32)
    out = [
        Sample(
            [x, labels],
            lambda t, i, r=r: cross_entropy_sharded_loss(t, i, reduction=r),
            lambda t, i, r=r: _reference(t, i, r),
            name=r,
            **_ULPS,
        )
        for r in _REDUCTIONS
    ]
    ignore = int(labels[0])
    out.append(
        Sample(
            [x, labels],
            lambda t, i: cross_entropy_sharded_loss(t, i, popxl.constant(ignore, popxl.int32)),
            lambda t, i: _reference(t, i, ignore=ignore),
            name="ignore_index",
            **_ULPS,
        )
    )
    return out


def _grad_samples():
    rng = np.random.default_rng(37)
    x = rng.uniform(-3, 3, (5, 7)).astype(np.float32)
    labels = rng.integers(0, 7, 5).astype(np.int32)
    dloss = rng.standard_normal(5).astype(np.float32)

    def build(g, t, i):
        _, nls = create_op(CROSS_ENTROPY_SHARDED, [t, i], _attrs(None, 0.4))
        return create_op(CROSS_ENTROPY_SHARDED_GRAD, [g, nls, i], _attrs(None, 0.4, False))[0]

    def ref(g, t, i):
        t = t.detach().requires_grad_()
        with torch.enable_grad():
            return torch.autograd.grad(_reference(t, i, "none"), t, g)[0]

    return [Sample([dloss, x, labels], build, ref, grad=False, **_ULPS)]


CROSS_ENTROPY_SHARDED = register(
    OpDef(
        "CrossEntropySharded",
        _infer,
        emit=exchanging_emit(_kernel, ("max", "add", "add")),
        grad=_grad,
        cost=_cost,
        samples=_samples,
        collective=True,
    )
)
# three all-reduces of one value per sample: the max, the sum of exponentials, the loss
RING_FACTOR.register(CROSS_ENTROPY_SHARDED, Exchanges(lambda ins, outs, a: [outs[0].nbytes] * 3))
CROSS_ENTROPY_SHARDED_GRAD = register(
    OpDef(
        "CrossEntropyShardedGrad",
        _grad_infer,
        _grad_kernel,
        cost=_grad_cost,
        samples=_grad_samples,
        out_name="cross_entropy_sharded_grad_out",
        numerics_kernels={"torch": lambda *a, **k: _grad_kernel(*a, exp=torch.exp, **k)},
    )
)


def _attrs(group, available_memory_proportion: float, with_group: bool = True) -> dict:
    attrs = {"available_memory_proportion": float(available_memory_proportion)}
    return {"group": resolve_group(group, gcg().ir), **attrs} if with_group else attrs


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
    attrs = _attrs(group, available_memory_proportion)
    loss = create_op(CROSS_ENTROPY_SHARDED, [logits, indices], attrs, out_names=_OUT_NAMES)[0]
    if ignore_index is not None:
        mask = ops.cast(ops.logical_not(ops.equal(indices, ignore_index)), loss.dtype)
        loss = loss * mask
        if reduction == "mean":
            return ops.sum(loss) / ops.sum(mask)
    if reduction == "mean":
        return ops.mean(loss)
    return ops.sum(loss) if reduction == "sum" else loss
