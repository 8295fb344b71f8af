"""Elementwise selection: maximum (of any number of tensors) and where (by a condition)."""

from __future__ import annotations

import functools

import torch

from .. import dtypes
from ..tensor import Tensor
from ._utils import as_tensor, broadcast_shapes, coerce_pair, rand, same_dtype, spec, unbroadcast
from .registry import OpDef, Sample, create_op, register

__all__ = ["maximum", "where"]


# maximum -------------------------------------------------------------------------------------


def _max_infer(ins, **attrs):
    same_dtype(*ins)
    return [spec(broadcast_shapes(*[s.shape for s in ins]), ins[0].dtype)]


def _max_grad(ctx):
    from .logical import equal

    g, out = ctx.grad_output(0), ctx.output(0)
    grads = []
    for i, t in enumerate(ctx.op.inputs):
        if not ctx.requires_grad(i):
            grads.append(None)
            continue
        # Every input equal to the maximum receives the full gradient (PopART's MaxArgGrad).
        grads.append(unbroadcast(where(equal(ctx.input(i), out), g, 0.0), t.shape))
    return grads


def _max_kernel(*ts):
    return functools.reduce(torch.maximum, ts)


def _max_ref(*ts):
    return functools.reduce(torch.maximum, ts)


MAX = register(
    OpDef(
        "Max",
        _max_infer,
        _max_kernel,
        grad=_max_grad,
        out_name="max_out",
        samples=lambda: [
            Sample(
                [rand(3, 4, seed=70), rand(3, 4, seed=71)], lambda a, b: maximum(a, b), _max_ref
            ),
            Sample(
                [rand(2, 3, 4, seed=72), rand(4, seed=73), rand(3, 1, seed=74)],
                lambda a, b, c: maximum(a, b, c),
                _max_ref,
                name="three_broadcast",
            ),
            Sample([rand(5, seed=75)], lambda a: maximum(a), _max_ref, name="one"),
        ],
    )
)


def maximum(*ts: Tensor | float) -> Tensor:
    """Elementwise maximum of one or more tensors, broadcasting."""
    if not ts:
        raise ValueError("maximum needs at least one tensor.")
    like = next((t for t in ts if isinstance(t, Tensor)), None)
    if like is None:
        raise TypeError(f"maximum needs at least one popxl.Tensor, got {ts!r}.")
    return create_op(MAX, [as_tensor(t, like) for t in ts])[0]


# where ---------------------------------------------------------------------------------------


def _where_infer(ins, **attrs):
    cond, lhs, rhs = ins
    if cond.dtype is not dtypes.bool:
        raise TypeError(
            f"the condition must be a bool tensor, got {cond.dtype.name}; "
            "build it with a comparison (ops.greater, ops.equal) or ops.cast"
        )
    same_dtype(lhs, rhs)
    return [spec(broadcast_shapes(cond.shape, lhs.shape, rhs.shape), lhs.dtype)]


def _where_grad(ctx):
    g, cond = ctx.grad_output(0), None
    _, lhs, rhs = ctx.op.inputs
    grads = [None, None, None]
    if ctx.requires_grad(1) or ctx.requires_grad(2):
        cond = ctx.input(0)
    if ctx.requires_grad(1):
        grads[1] = unbroadcast(where(cond, g, 0.0), lhs.shape)
    if ctx.requires_grad(2):
        grads[2] = unbroadcast(where(cond, 0.0, g), rhs.shape)
    return grads


WHERE = register(
    OpDef(
        "Where",
        _where_infer,
        torch.where,
        grad=_where_grad,
        out_name="where_out",
        fp16_in_fp32=False,
        samples=lambda: [
            Sample(
                [rand(3, 4, seed=80) > 0, rand(3, 4, seed=81), rand(3, 4, seed=82)],
                lambda c, a, b: where(c, a, b),
                torch.where,
            ),
            Sample(
                [rand(4, seed=83) > 0, rand(2, 3, 1, seed=84), rand(3, 4, seed=85)],
                lambda c, a, b: where(c, a, b),
                torch.where,
                name="broadcast",
            ),
            Sample(
                [rand(3, 4, seed=86) > 0, rand(3, 4, seed=87)],
                lambda c, a: where(c, a, 0.5),
                lambda c, a: torch.where(c, a, 0.5),
                name="scalar_rhs",
            ),
        ],
    )
)


def where(condition: Tensor, lhs: Tensor | float, rhs: Tensor | float) -> Tensor:
    """Elementwise ``lhs if condition else rhs``, broadcasting all three."""
    if not isinstance(condition, Tensor):
        raise TypeError(f"where: condition must be a bool popxl.Tensor, got {condition!r}.")
    return create_op(WHERE, [condition, *coerce_pair(lhs, rhs)])[0]
