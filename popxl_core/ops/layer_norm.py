"""``native_layer_norm``: torch's layer norm over the trailing ``normalized_shape`` axes, with
eager torch's kernels forward (``aten.native_layer_norm``) and backward
(``aten.native_layer_norm_backward``), so a traced ``nn.LayerNorm`` matches eager bit for bit.

(popxl's own ``layer_norm`` normalises over axis 1 like PopART's GroupNormalization and keeps
that definition; this op is torch's.) Like GroupNormalization it has three outputs: the result,
the mean and the inverse standard deviation (shape ``x.shape[:-k] + (1,) * k``), the last two
read by the gradient op.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

from ..sim.speed import declare
from ..tensor import Tensor
from ._utils import rand, same_dtype, spec
from .forms import ReplicaFold
from .registry import Cost, OpDef, Sample, create_op, register

__all__ = ["native_layer_norm"]

_BWD = torch.ops.aten.native_layer_norm_backward


def _infer(ins, normalized_shape, epsilon, has_weight, has_bias):
    x, params = ins[0], ins[1:]
    same_dtype(*ins)
    if not x.dtype.is_floating_point:
        raise TypeError(f"layer norm needs a floating point input, got {x.dtype.name}")
    k = len(normalized_shape)
    if k == 0 or tuple(x.shape[len(x.shape) - k :]) != tuple(normalized_shape):
        raise ValueError(
            f"normalized_shape {tuple(normalized_shape)} is not the trailing shape "
            f"of the input {x.shape}"
        )
    if len(params) != int(has_weight) + int(has_bias):
        raise ValueError("give exactly the weight and bias that has_weight/has_bias announce")
    for p in params:
        if tuple(p.shape) != tuple(normalized_shape):
            raise ValueError(f"weight/bias {p.shape} must have shape {tuple(normalized_shape)}")
    stats = spec((*x.shape[: len(x.shape) - k], *([1] * k)), x.dtype)
    return [x, stats, stats]


def _split(params, has_weight, has_bias):
    params = list(params)
    w = params.pop(0) if has_weight else None
    b = params.pop(0) if has_bias else None
    return w, b


def _kernel(x, *params, normalized_shape, epsilon, has_weight, has_bias):
    w, b = _split(params, has_weight, has_bias)
    return tuple(torch.native_layer_norm(x, list(normalized_shape), w, b, epsilon))


def _grad_infer(ins, normalized_shape, has_weight, has_bias):
    x = ins[1]
    w_spec = spec(tuple(normalized_shape), x.dtype)
    return [x] + [w_spec] * (int(has_weight) + int(has_bias))


def _grad_kernel(g, x, mean, rstd, *params, normalized_shape, has_weight, has_bias):
    w, b = _split(params, has_weight, has_bias)
    mask = [True, has_weight, has_bias]
    dx, dw, db = _BWD(g, x, list(normalized_shape), mean, rstd, w, b, mask)
    outs = tuple(t for t in (dx, dw, db) if t is not None)
    return outs if len(outs) > 1 else dx  # the simulator takes one output as a tensor


def _rows(attrs, shapes, per) -> bool:
    """Replicas folded (sim/fold.py): rows of x normalised alone, parameters shared."""
    return per[0] and not any(per[1:]) and len(attrs["normalized_shape"]) < len(shapes[0])


def _grad_rows(attrs, shapes, per) -> bool:
    return all(per[:4]) and not any(per[4:]) and len(attrs["normalized_shape"]) < len(shapes[1])


def _dx_over_all_rows(args, normalized_shape, has_weight, has_bias):
    """The folded kernels' common start: the arguments unpacked and ``dx`` of all replicas'
    rows in one call (each row's ``dx`` depends on that row alone)."""
    g, x, mean, rstd, *params = args
    w, b = _split(params, has_weight, has_bias)
    shape = list(normalized_shape)
    dx = _BWD(g, x, shape, mean, rstd, w, b, [True, False, False])[0]
    return g, x, mean, rstd, w, b, shape, dx


def _folded_grad(args, replicas, dead, buffers, normalized_shape, has_weight, has_bias):
    """``dx`` over all replicas' rows in one call; each replica's own parameter gradients
    (sums over its rows), concatenated."""
    g, x, mean, rstd, w, b, shape, dx = _dx_over_all_rows(
        args, normalized_shape, has_weight, has_bias
    )
    if not (has_weight or has_bias):
        return dx
    n = g.shape[0] // replicas
    mask = [False, has_weight, has_bias]
    each = zip(*(t.split(n) for t in (g, x, mean, rstd)))  # one call per tensor: views
    parts = [_BWD(gr, xr, shape, mr, rr, w, b, mask) for gr, xr, mr, rr in each]
    dw = [torch.cat([p[k] for p in parts]) for k in (1, 2) if mask[k]]
    return (dx, *dw)


def _side_by_side_grad(args, replicas, dead, buffers, normalized_shape, has_weight, has_bias):
    """``dx`` over all replicas' rows in one call, and every replica's parameter gradients in
    a second: the kernel sums its rows' ``dy * xhat`` (``xhat = rstd * x - rstd * mean``, one
    fused multiply-add where the kernel's is) and ``dy`` over its M rows, split among the
    threads by row, so the replicas' rows side by side, ``(M, R * N)``, with mean 0 and rstd
    1 and ``xhat`` given, make each replica's sums over its own M rows in the same order:
    ``(R * N,)``, replica r's gradient at ``[r * N, (r + 1) * N)``. ``xhat`` must come out
    with the kernel's own bits (checked, with the rest, by the fold site)."""
    g, x, mean, rstd, w, b, shape, dx = _dx_over_all_rows(
        args, normalized_shape, has_weight, has_bias
    )
    if not (has_weight or has_bias):
        return dx
    r, n = replicas, math.prod(shape)
    rows = g.numel() // (r * n)  # M: one replica's rows
    dys, xhat, dys_r, xhat_r = _side_by_side(buffers, rows, r, n, x.dtype)
    grouped, stats = (r, rows, n), (r, rows, 1)
    # the kernel's shift -(rstd * mean), one call: 0 - rstd * mean is +0 where it is -0 (a
    # mean of +0), which changes xhat only at x = -0 (to +0), and a +0 or -0 term leaves the
    # sums (started at +0) the same
    shift = torch.addcmul(_zeros(mean.shape, x.dtype), rstd, mean, value=-1).view(stats)
    torch.addcmul(shift, x.view(grouped), rstd.view(stats), out=xhat_r)
    dys_r.copy_(g.view(grouped))
    zero, one, ones = _unit_stats(rows, r * n, x.dtype)
    mask = [False, has_weight, has_bias]
    _, dw, db = _BWD(dys, xhat, [r * n], zero, one, ones, ones, mask)
    outs = [t for t, m in zip((dw, db), mask[1:]) if m]
    if len(shape) > 1:  # as one replica's gradients concatenated: (R * shape[0], ...)
        outs = [t.view(r * shape[0], *shape[1:]) for t in outs]
    return (dx, *outs)


def _dx_rest(args, replicas, dead, normalized_shape, has_weight, has_bias):
    """``dx`` over all replicas' rows, None for the parameter gradients (`_params_together`
    computes them, with other layer norms')."""
    dx = _dx_over_all_rows(args, normalized_shape, has_weight, has_bias)[-1]
    return (dx, *[None] * (int(has_weight) + int(has_bias)))


def _params_together(calls, replicas, normalized_shape, has_weight, has_bias):
    """The parameter gradients of K layer norms of one shape (their ``(g, x, mean, rstd,
    ...)`` in ``calls``), every replica's, in one kernel call: `_side_by_side_grad`'s
    arithmetic with the K calls' replicas side by side, ``(M, R * K * N)``, column
    ``(r, k, j)`` replica r's column j of call k: each gradient as ``(R, K, N)``."""
    r, n, k = replicas, math.prod(normalized_shape), len(calls)
    rows = calls[0][0].numel() // (r * n)
    at = calls[0][0].dim() - len(normalized_shape)  # the calls side by side: (R, M, K, ...)
    grouped, stats = (r, rows, k, n), (r, rows, k, 1)
    dys, x, mean, rstd = (torch.stack([c[i] for c in calls], at) for i in range(4))
    mean, rstd = mean.view(stats), rstd.view(stats)
    shift = torch.addcmul(_zeros(stats, x.dtype), rstd, mean, value=-1)
    xhat = torch.addcmul(shift, x.view(grouped), rstd)
    zero, one, ones = _unit_stats(rows, r * k * n, x.dtype)
    mask = [False, has_weight, has_bias]
    # rows M, columns (R, K, N): the kernel lays the transposed operands out itself
    dys, xhat, ones = dys.view(grouped).transpose(0, 1), xhat.transpose(0, 1), ones.view(r, k, n)
    _, dw, db = _BWD(dys, xhat, [r, k, n], zero, one, ones, ones, mask)
    return [t for t, m in zip((dw, db), mask[1:]) if m]


def _side_by_side(buffers, rows: int, replicas: int, n: int, dtype) -> tuple:
    """Two ``(M, R * N)`` tensors (row i: each replica's row i) and their ``(R, M, N)``
    views by replica, kept in ``buffers`` between runs where the op runs once a run."""
    key = ("side_by_side", rows, replicas, n, dtype)
    if buffers is not None and key in buffers:
        return buffers[key]
    pair = [torch.empty(rows, replicas * n, dtype=dtype) for _ in range(2)]
    views = [t.view(rows, replicas, n).transpose(0, 1) for t in pair]
    made = (*pair, *views)
    if buffers is not None:
        buffers[key] = made
    return made


@functools.lru_cache(maxsize=64)
def _zeros(shape: tuple, dtype: torch.dtype) -> torch.Tensor:
    """Zeros (read, never written)."""
    return torch.zeros(shape, dtype=dtype)


@functools.lru_cache(maxsize=64)
def _unit_stats(rows: int, width: int, dtype: torch.dtype):
    """Mean 0 and rstd 1 for ``rows`` rows, and a weight of ones (read, never written)."""
    return (
        torch.zeros(rows, 1, dtype=dtype),
        torch.ones(rows, 1, dtype=dtype),
        torch.ones(width, dtype=dtype),
    )


def _cost(flops: int):
    def cost(ins, outs, attrs) -> Cost:
        return Cost(flops * ins[0].nelms, sum(s.nbytes for s in (*ins, *outs)))

    return cost


def _grad(ctx):
    if ctx.grad_output(1) is not None or ctx.grad_output(2) is not None:
        raise NotImplementedError("native_layer_norm: no gradient through mean and rstd")
    a = ctx.attrs
    params = [ctx.input(i) for i in range(1, len(ctx.op.inputs))]
    ins = [ctx.grad_output(0), ctx.input(0), ctx.output(1), ctx.output(2), *params]
    attrs = {k: a[k] for k in ("normalized_shape", "has_weight", "has_bias")}
    return create_op(LAYER_NORM_GRAD, ins, attrs)


def _samples():
    """Bitwise (rtol=atol=0) against F.layer_norm (the same aten kernel)."""
    x, w, b = rand(2, 3, 8, seed=900), rand(8, low=0.5, high=1.5, seed=901), rand(8, seed=902)
    exact = {"rtol": 0.0, "atol": 0.0}
    return [
        Sample(
            [x, w, b],
            lambda x, w, b: native_layer_norm(x, (8,), w, b),
            lambda x, w, b: F.layer_norm(x, (8,), w, b),
            name="affine",
            **exact,
        ),
        Sample(
            [x],
            lambda x: native_layer_norm(x, (3, 8), eps=1e-3),
            lambda x: F.layer_norm(x, (3, 8), eps=1e-3),
            name="plain_2axes",
            **exact,
        ),
        Sample(
            [x, w],
            lambda x, w: native_layer_norm(x, (8,), w),
            lambda x, w: F.layer_norm(x, (8,), w),
            name="weight_only",
            **exact,
        ),
    ]


def _grad_samples():
    def build(g, x, w, b):
        attrs = {"normalized_shape": (8,), "has_weight": True, "has_bias": True}
        _, mean, rstd = create_op(LAYER_NORM, [x, w, b], {**attrs, "epsilon": 1e-5})
        return tuple(create_op(LAYER_NORM_GRAD, [g, x, mean, rstd, w, b], attrs))

    def ref(g, x, w, b):
        x, w, b = (t.detach().requires_grad_() for t in (x, w, b))
        with torch.enable_grad():
            return torch.autograd.grad(F.layer_norm(x, (8,), w, b), (x, w, b), g)

    inputs = [
        rand(4, 5, 8, seed=903),
        rand(4, 5, 8, seed=904),
        rand(8, low=0.5, high=1.5, seed=905),
        rand(8, seed=906),
    ]
    return [Sample(inputs, build, ref, grad=False, rtol=0.0, atol=0.0)]


LAYER_NORM = register(
    OpDef(
        "LayerNorm",
        _infer,
        _kernel,
        grad=_grad,
        cost=_cost(8),
        samples=_samples,
        out_name="layer_norm_out",
    )
)
declare(LAYER_NORM, replica_fold=ReplicaFold(rows=_rows))
LAYER_NORM_GRAD = register(
    OpDef(
        "LayerNormGrad",
        _grad_infer,
        _grad_kernel,
        cost=_cost(12),
        samples=_grad_samples,
        out_name="layer_norm_grad_out",
    )
)
declare(
    LAYER_NORM_GRAD,
    replica_fold=ReplicaFold(
        rows=_grad_rows,
        kernels=(_side_by_side_grad, _folded_grad),
        together=_params_together,
        together_outputs=(1, 2),
        rest=_dx_rest,
    ),
)


def native_layer_norm(
    x: Tensor,
    normalized_shape,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-5,
) -> Tensor:
    """torch's ``F.layer_norm``: normalise over the trailing ``normalized_shape`` axes, then
    scale by ``weight`` and shift by ``bias`` (each of that shape, optional)."""
    params = [t for t in (weight, bias) if t is not None]
    attrs = {
        "normalized_shape": tuple(int(d) for d in normalized_shape),
        "epsilon": float(eps),
        "has_weight": weight is not None,
        "has_bias": bias is not None,
    }
    return create_op(LAYER_NORM, [x, *params], attrs)[0]
