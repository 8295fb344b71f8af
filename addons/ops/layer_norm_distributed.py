"""Layer normalisation of a tensor sharded along its hidden axis across a replica group
(popxl.addons' ``layer_norm_distributed``; there one C++ op, ``LayerNormDistributed``, and its
grad op).

``LayerNormDistributed`` outputs, as Graphcore's, the normalised shard and each row's mean
and inverse standard deviation ``(N,)`` over the whole hidden axis. The statistics take two
all-reduces over the group: the rows' sums, then the sums of squares about the mean (the
two-pass form, PopART's ``enableStableNorm``; the one-pass ``E[x^2] - mean^2`` loses digits
for inputs far from 0). ``LayerNormDistributedGrad`` all-reduces the rows' two sums of the
input gradient (``dy * w`` and ``dy * w * xhat``) in one exchange, as Graphcore's multi-tensor
all-reduce does; the weight and bias gradients are the shard's own (no exchange). Graphcore's
grad op passes ``dy`` to the statistics' gradient without the weight (exact only where the
weight is 1, as at initialisation); this one is torch's ``layer_norm`` gradient.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F

from popxl_core import ReplicaGrouping, Tensor, TensorSpec
from popxl_core.context import gcg
from popxl_core.ops.collectives.collectives import group_size, resolve_group
from popxl_core.ops.registry import Cost, OpDef, Sample, create_op, register
from popxl_core.sim.ring import RING_FACTOR, Exchanges

from .exchanging_kernel import exchanging_emit, table_kernel, widened

__all__ = ["layer_norm_distributed", "LAYER_NORM_DISTRIBUTED", "LAYER_NORM_DISTRIBUTED_GRAD"]


def _infer(ins, epsilon, group, hidden):
    t, w, b = ins
    if len(t.shape) != 2 or tuple(w.shape) != (t.shape[1],) or tuple(b.shape) != w.shape:
        raise ValueError(
            f"layer_norm_distributed takes t (N, H) and w, b (H,); got {t.shape}, {w.shape}, "
            f"{b.shape}."
        )
    stats = TensorSpec((t.shape[0],), t.dtype)
    return [t, stats, stats]


def _kernel(t, w, b, *, exchange, numerics, epsilon, hidden):
    """(y, mean, 1 / std): the statistics over the group's whole hidden axis."""
    sqrt = table_kernel("Sqrt", numerics)
    x = widened(t)
    mean = exchange(0, torch.sum(x, -1, keepdim=True)) / hidden
    centred = x - mean
    var = exchange(1, torch.sum(centred * centred, -1, keepdim=True))
    inv_std = 1 / sqrt(var / hidden + epsilon)
    y = centred * inv_std * widened(w) + widened(b)
    return y.to(t.dtype), mean[:, 0].to(t.dtype), inv_std[:, 0].to(t.dtype)


def _grad(ctx):
    if ctx.grad_output(1) is not None or ctx.grad_output(2) is not None:
        raise NotImplementedError("LayerNormDistributed: no gradient through mean and 1 / std")
    a = ctx.attrs
    ins = [ctx.grad_output_or_zero(0), ctx.input(0), ctx.input(1), ctx.output(1), ctx.output(2)]
    attrs = {"group": a["group"], "hidden": a["hidden"]}
    return create_op(LAYER_NORM_DISTRIBUTED_GRAD, ins, attrs)


def _grad_infer(ins, group, hidden):
    dy, x, w, mean, inv_std = ins
    if dy.shape != x.shape or mean.shape != inv_std.shape or mean.shape != (x.shape[0],):
        raise ValueError(
            f"LayerNormDistributedGrad: dy {dy.shape}, x {x.shape}, mean {mean.shape} and "
            f"1 / std {inv_std.shape} do not agree"
        )
    return [x, w, w]


def _grad_kernel(dy, x, w, mean, inv_std, *, exchange, numerics, hidden):
    """(dx, dw, db): dx from the rows' sums of ``dy * w`` and ``dy * w * xhat`` over the
    whole hidden axis (one all-reduce of both), dw and db over this shard's rows."""
    g, rstd = widened(dy), widened(inv_std)[:, None]
    xhat = (widened(x) - widened(mean)[:, None]) * rstd
    gw = g * widened(w)
    sums = exchange(0, torch.stack([gw.sum(-1), (gw * xhat).sum(-1)]))
    dx = (gw - sums[0][:, None] / hidden - xhat * (sums[1][:, None] / hidden)) * rstd
    dw, db = torch.sum(g * xhat, 0), torch.sum(g, 0)
    return dx.to(dy.dtype), dw.to(w.dtype), db.to(w.dtype)


def _cost(flops: int):
    def cost(ins, outs, attrs) -> Cost:
        return Cost(flops * ins[0].nelms, sum(s.nbytes for s in (*ins, *outs)))

    return cost


def _samples():
    """One replica: the statistics are the whole row's, against torch's layer norm."""
    rng = np.random.default_rng(38)
    x = rng.standard_normal((4, 16)).astype(np.float32) * 3 + 1
    w = rng.uniform(0.5, 1.5, 16).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float32)
    return [
        Sample(
            [x, w, b],
            lambda t, wt, bt, e=eps: layer_norm_distributed(t, wt, bt, e),
            lambda t, wt, bt, e=eps: F.layer_norm(t, (16,), wt, bt, e),
            name=f"eps{eps:g}",
            rtol=1e-6,
            atol=1e-6,
        )
        for eps in (1e-5, 1e-2)
    ]


def _grad_samples():
    rng = np.random.default_rng(39)
    dy, x = (rng.standard_normal((3, 8)).astype(np.float32) for _ in range(2))
    w, b = rng.uniform(0.5, 1.5, 8).astype(np.float32), rng.standard_normal(8).astype(np.float32)

    def build(g, t, wt, bt):
        attrs = _attrs(t, None)
        _, mean, inv_std = create_op(
            LAYER_NORM_DISTRIBUTED, [t, wt, bt], {**attrs, "epsilon": 1e-5}
        )
        return tuple(create_op(LAYER_NORM_DISTRIBUTED_GRAD, [g, t, wt, mean, inv_std], attrs))

    def ref(g, t, wt, bt):
        t, wt, bt = (a.detach().requires_grad_() for a in (t, wt, bt))
        with torch.enable_grad():
            return torch.autograd.grad(F.layer_norm(t, (8,), wt, bt), (t, wt, bt), g)

    return [Sample([dy, x, w, b], build, ref, grad=False, rtol=1e-6, atol=1e-6)]


LAYER_NORM_DISTRIBUTED = register(
    OpDef(
        "LayerNormDistributed",
        _infer,
        emit=exchanging_emit(_kernel, ("add", "add")),
        grad=_grad,
        cost=_cost(8),
        samples=_samples,
        collective=True,
    )
)
# two all-reduces of one value per row (the sums, then the squares about the mean)
RING_FACTOR.register(LAYER_NORM_DISTRIBUTED, Exchanges(lambda ins, outs, a: [outs[1].nbytes] * 2))
LAYER_NORM_DISTRIBUTED_GRAD = register(
    OpDef(
        "LayerNormDistributedGrad",
        _grad_infer,
        emit=exchanging_emit(_grad_kernel, ("add",)),
        cost=_cost(12),
        samples=_grad_samples,
        collective=True,
    )
)
# one all-reduce of two values per row
RING_FACTOR.register(
    LAYER_NORM_DISTRIBUTED_GRAD, Exchanges(lambda ins, outs, a: [2 * ins[3].nbytes])
)


def _attrs(t: Tensor, group: Optional[ReplicaGrouping]) -> dict:
    ir = gcg().ir
    resolved = resolve_group(group, ir)
    return {"group": resolved, "hidden": t.shape[-1] * group_size(resolved, ir)}


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
    attrs = {**_attrs(t, group), "epsilon": float(epsilon)}
    names = ["outputs", "mean", "std"]
    return create_op(LAYER_NORM_DISTRIBUTED, [t, w, b], attrs, out_names=names)[0]
