"""Reductions over axes: sum, mean, max, min, prod, median, sumsquare, logsum, logsumexp, l1, l2.

All share one signature ``(t, axis=None, keepdims=False)``; ``axis=None`` reduces every axis and
an empty axis list reduces nothing. Gradients are written with our own ops; the one helper op,
``ReduceSumGrad`` (`reduce_grad`), broadcasts a reduced gradient back to the input shape.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Dict

import numpy as np
import torch

from ..sim.speed import declare
from ..tensor import Tensor
from ._dtype_rules import check_float
from ._utils import normalize_axes, spec
from .forms import ReplicaFold
from .reduce_grad import expand_reduced, keep_shape, reduced_shape
from .reduce_index import argmax, argmin, cumsum, topk
from .registry import Cost, OpDef, create_op, register

__all__ = [
    "argmax",
    "argmin",
    "cumsum",
    "l1",
    "l2",
    "logsum",
    "logsumexp",
    "max",
    "mean",
    "median",
    "min",
    "prod",
    "reduce_sum",
    "sum",
    "sumsquare",
    "topk",
]

Axis = int | Iterable[int] | None


def _make_infer(float_only: bool) -> Callable:
    def infer(ins, axes, keepdims):
        x = ins[0]
        if float_only:
            check_float(x)
        return [spec(reduced_shape(x.shape, axes, keepdims), x.dtype)]

    return infer


def _reduce_cost(ins, outs, attrs) -> Cost:
    # One combine per input element (the reduction tree has nelms - 1 adds, plus the map).
    return Cost(ins[0].nelms, ins[0].nbytes + outs[0].nbytes)


# kernels ---------------------------------------------------------------------------------
def _to_last(x: torch.Tensor, axes: tuple[int, ...]) -> torch.Tensor:
    """Move the reduced axes to the end and flatten them into one (for 1-axis torch ops)."""
    rest = [i for i in range(x.dim()) if i not in axes]
    x = x.permute(*rest, *axes)
    return x.reshape(*x.shape[: len(rest)], -1)


def _make_kernel(fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable:
    """Kernel reducing the last axis with ``fn`` after flattening the reduced axes into it.

    An empty axis list reduces over a new size-1 axis, so ``fn`` then acts elementwise
    (torch would otherwise treat ``dim=()`` as "all axes").
    """

    def kernel(x, axes, keepdims):
        y = fn(_to_last(x, axes) if axes else x.unsqueeze(-1))
        if keepdims:
            y = y.reshape(keep_shape(x.shape, axes))
        return y if y.dtype == x.dtype else y.to(x.dtype)

    return kernel


def _sum_kernel(x, axes, keepdims):
    """ReduceSum. One axis is summed directly: the permute-and-flatten of `_make_kernel` is a
    view then, and torch reduces it in the same order (bitwise equal,
    tests/test_reduce_sum_axis.py), in one call instead of five; a linear layer's bias
    gradient is this op, every training step."""
    if len(axes) == 1:
        y = torch.sum(x, dim=axes[0], keepdim=keepdims)
        return y if y.dtype == x.dtype else y.to(x.dtype)
    return _sum_any(x, axes, keepdims)


def _torch_kernel(fn):
    """``Ir.numerics == "torch"``: torch's own reduction over all ``axes`` in one call, as
    eager's ``sum_to`` reduces a broadcast gradient (``grad.sum((0, 2, 3), keepdim=True)``);
    summing the axes flattened last is another order, ulps off for more than one axis."""

    def kernel(x, axes, keepdims):
        y = fn(x, dim=tuple(axes), keepdim=keepdims) if axes else x.clone()
        return y if y.dtype == x.dtype else y.to(x.dtype)

    return kernel


_TORCH_KERNELS = {"ReduceSum": _torch_kernel(torch.sum), "ReduceMean": _torch_kernel(torch.mean)}


def _median_last(x: torch.Tensor) -> torch.Tensor:
    return torch.median(x, dim=-1).values


def _logsum_last(x: torch.Tensor) -> torch.Tensor:
    return torch.log(torch.sum(x, dim=-1))


_KERNELS = {
    "ReduceSum": lambda x: torch.sum(x, dim=-1),
    "ReduceMean": lambda x: torch.mean(x, dim=-1),
    "ReduceMax": lambda x: torch.amax(x, dim=-1),
    "ReduceMin": lambda x: torch.amin(x, dim=-1),
    "ReduceProd": lambda x: torch.prod(x, dim=-1),
    "ReduceMedian": _median_last,
    "ReduceSumSquare": lambda x: torch.sum(x * x, dim=-1),
    "ReduceLogSum": _logsum_last,
    "ReduceLogSumExp": lambda x: torch.logsumexp(x, dim=-1),
    "ReduceL1": lambda x: torch.sum(torch.abs(x), dim=-1),
    "ReduceL2": lambda x: torch.linalg.vector_norm(x, dim=-1),
}


# gradients -------------------------------------------------------------------------------
def _keep(ctx, t: Tensor) -> Tensor:
    """A reduced tensor reshaped to keepdims form, so it broadcasts against the input."""
    from . import reshape

    a = ctx.attrs
    shape = keep_shape(ctx.op.inputs[0].shape, a["axes"])
    return t if tuple(t.shape) == shape else reshape(t, shape)


def _sum_grad(ctx):
    a = ctx.attrs
    return [expand_reduced(ctx.grad_output(0), ctx.op.inputs[0].shape, a["axes"], a["keepdims"])]


def _mean_grad(ctx):
    a = ctx.attrs
    shape = ctx.op.inputs[0].shape
    n = int(np.prod([shape[i] for i in a["axes"]], dtype=np.int64))
    return [expand_reduced(ctx.grad_output(0), shape, a["axes"], a["keepdims"], 1.0 / n)]


def _select_grad(ctx):
    """max/min/median: the gradient goes to the selected positions, split evenly among ties
    (torch's amax/amin rule)."""
    from . import cast, div, equal, mul

    x, a = ctx.input(0), ctx.attrs
    mask = cast(equal(x, _keep(ctx, ctx.output(0))), x.dtype)
    count = sum(mask, a["axes"], keepdims=True)
    return [mul(div(mask, count), _keep(ctx, ctx.grad_output(0)))]


def _prod_grad(ctx):
    from . import div, mul

    y_over_x = div(_keep(ctx, ctx.output(0)), ctx.input(0))  # needs x != 0, as torch's fast path
    return [mul(y_over_x, _keep(ctx, ctx.grad_output(0)))]


def _sumsquare_grad(ctx):
    from . import mul

    return [mul(mul(ctx.input(0), 2.0), _keep(ctx, ctx.grad_output(0)))]


def _logsum_grad(ctx):
    from . import div, exp

    g_over_sum = div(ctx.grad_output(0), exp(ctx.output(0)))
    a = ctx.attrs
    return [expand_reduced(g_over_sum, ctx.op.inputs[0].shape, a["axes"], a["keepdims"])]


def _logsumexp_grad(ctx):
    from . import exp, mul, sub

    probs = exp(sub(ctx.input(0), _keep(ctx, ctx.output(0))))
    return [mul(probs, _keep(ctx, ctx.grad_output(0)))]


def _l1_grad(ctx):
    from . import mul, sign

    return [mul(sign(ctx.input(0)), _keep(ctx, ctx.grad_output(0)))]


def _l2_grad(ctx):
    from . import div, mul

    return [mul(div(ctx.input(0), _keep(ctx, ctx.output(0))), _keep(ctx, ctx.grad_output(0)))]


_sum_any = _make_kernel(_KERNELS["ReduceSum"])


# replicas folded (sim/fold.py) ---------------------------------------------------------
def _fold_rows(attrs, shapes, per) -> bool:
    return bool(per[0])


def _folded(kernel: Callable) -> Callable:
    """``kernel`` over all replicas' rows: row-wise where axis 0 is kept; where it is reduced
    (a bias gradient, a loss), over the ``(R, b, ...)`` view with the axes one further, each
    replica's reduction over its own rows, ``(R, ...)`` (``(R * out, ...)`` as one
    replica's outputs concatenated; rank 0 on one replica: ``(R,)``)."""

    def folded(args, replicas, dead, buffers, axes, keepdims):
        (x,) = args
        if 0 not in axes:
            return kernel(x, axes, keepdims)
        grouped = x.view(replicas, x.shape[0] // replicas, *x.shape[1:])
        y = kernel(grouped, tuple(a + 1 for a in axes), keepdims)
        return y.reshape(replicas * y.shape[1], *y.shape[2:]) if y.dim() > 1 else y

    return folded


def _replica_fold(name: str, kernel: Callable) -> ReplicaFold:
    """Its kernels for each numerics (tried in order: the first whose bits match)."""
    kernels = [kernel]
    if name in _TORCH_KERNELS:
        kernels.insert(0, _TORCH_KERNELS[name])
    return ReplicaFold(rows=_fold_rows, kernels=tuple(_folded(k) for k in kernels))


# declaration -----------------------------------------------------------------------------
REDUCE_OPS: Dict[str, OpDef] = {}


def _declare(name: str, grad, fn_name: str, *, float_only=False, low=-1.0, seed=0) -> OpDef:
    def samples():
        from ._reduce_samples import reduction_samples

        return reduction_samples(name, globals()[fn_name], low, seed)

    kernel = _sum_kernel if name == "ReduceSum" else _make_kernel(_KERNELS[name])
    opdef = register(
        OpDef(
            name,
            _make_infer(float_only),
            kernel,
            grad=grad,
            cost=_reduce_cost,
            samples=samples,
            out_name=f"{name.lower()}_out",
            numerics_kernels={"torch": _TORCH_KERNELS[name]} if name in _TORCH_KERNELS else {},
        )
    )
    declare(opdef, replica_fold=_replica_fold(name, kernel))
    REDUCE_OPS[name] = opdef
    return opdef


_declare("ReduceSum", _sum_grad, "sum", seed=100)
_declare("ReduceMean", _mean_grad, "mean", float_only=True, seed=110)
_declare("ReduceMax", _select_grad, "max", seed=120)
_declare("ReduceMin", _select_grad, "min", seed=130)
_declare("ReduceProd", _prod_grad, "prod", low=0.5, seed=140)
_declare("ReduceMedian", _select_grad, "median", seed=150)
_declare("ReduceSumSquare", _sumsquare_grad, "sumsquare", seed=160)
_declare("ReduceLogSum", _logsum_grad, "logsum", float_only=True, low=0.5, seed=170)
_declare("ReduceLogSumExp", _logsumexp_grad, "logsumexp", float_only=True, seed=180)
_declare("ReduceL1", _l1_grad, "l1", seed=190)
_declare("ReduceL2", _l2_grad, "l2", float_only=True, seed=200)


def _reduce(opdef: OpDef, t: Tensor, axis: Axis, keepdims: bool) -> Tensor:
    if not isinstance(t, Tensor):
        raise TypeError(f"{opdef.name}: expected a popxl.Tensor, got {type(t).__name__}.")
    try:
        axes = normalize_axes(axis, t.rank)
    except ValueError as e:
        raise ValueError(f"{opdef.name}: {e} (input {t.id} {t.shape})") from None
    return create_op(opdef, [t], {"axes": axes, "keepdims": bool(keepdims)})[0]


# public functions ------------------------------------------------------------------------
def sum(t: Tensor, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """Sum of ``t`` over ``axis`` (all axes if None)."""
    return _reduce(REDUCE_OPS["ReduceSum"], t, axis, keepdims)


reduce_sum = sum


def mean(t: Tensor, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """Mean of ``t`` over ``axis`` (all axes if None)."""
    return _reduce(REDUCE_OPS["ReduceMean"], t, axis, keepdims)


def max(t: Tensor, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """Maximum of ``t`` over ``axis`` (all axes if None)."""
    return _reduce(REDUCE_OPS["ReduceMax"], t, axis, keepdims)


def min(t: Tensor, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """Minimum of ``t`` over ``axis`` (all axes if None)."""
    return _reduce(REDUCE_OPS["ReduceMin"], t, axis, keepdims)


def prod(t: Tensor, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """Product of ``t`` over ``axis`` (all axes if None)."""
    return _reduce(REDUCE_OPS["ReduceProd"], t, axis, keepdims)


def median(t: Tensor, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """Median of ``t`` over ``axis`` (the lower of the two middle values for even counts)."""
    return _reduce(REDUCE_OPS["ReduceMedian"], t, axis, keepdims)


def sumsquare(t: Tensor, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """Sum of squares of ``t`` over ``axis``."""
    return _reduce(REDUCE_OPS["ReduceSumSquare"], t, axis, keepdims)


def logsum(t: Tensor, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """log(sum(t)) over ``axis``."""
    return _reduce(REDUCE_OPS["ReduceLogSum"], t, axis, keepdims)


def logsumexp(t: Tensor, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """log(sum(exp(t))) over ``axis``, computed stably."""
    return _reduce(REDUCE_OPS["ReduceLogSumExp"], t, axis, keepdims)


def l1(t: Tensor, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """Sum of absolute values of ``t`` over ``axis``."""
    return _reduce(REDUCE_OPS["ReduceL1"], t, axis, keepdims)


def l2(t: Tensor, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """Euclidean norm of ``t`` over ``axis``."""
    return _reduce(REDUCE_OPS["ReduceL2"], t, axis, keepdims)
