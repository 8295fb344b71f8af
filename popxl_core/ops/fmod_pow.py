"""fmod (the C remainder, sign of the dividend) and pow (a tensor or float exponent)."""

from __future__ import annotations

import numpy as np
import torch

from ..tensor import Constant, Tensor, constant
from ._utils import binary_infer, coerce_pair, rand, unbroadcast
from .registry import OpDef, Sample, create_op, register

__all__ = ["fmod", "pow"]


def _arithmetic():
    """The ops the gradients are built of (elementwise.py re-exports this module)."""
    from .elementwise import div, mul, negate, sub

    return div, mul, negate, sub


def _fmod_grad(ctx):
    div, mul, negate, sub = _arithmetic()
    g = ctx.grad_output(0)
    a, b = ctx.op.inputs
    gb = None
    if ctx.requires_grad(1):
        # d fmod(a, b)/db = -trunc(a / b) = -(a - fmod(a, b)) / b
        lhs, rhs = ctx.input(0), ctx.input(1)
        gb = unbroadcast(negate(mul(g, div(sub(lhs, ctx.output(0)), rhs))), b.shape)
    return [unbroadcast(g, a.shape) if ctx.requires_grad(0) else None, gb]


FMOD = register(
    OpDef(
        "Fmod",
        binary_infer,
        torch.fmod,
        grad=_fmod_grad,
        out_name="fmod_out",
        samples=lambda: [
            Sample(
                [
                    np.array([[2.3, -1.7, 0.4], [5.2, -4.1, 3.3]], np.float32),
                    np.array([[0.9, 1.1, 1.5], [1.6, 0.7, 2.3]], np.float32),
                ],
                lambda a, b: fmod(a, b),
                torch.fmod,
            ),
            Sample(
                [
                    np.array([[2.3, -1.7, 0.4], [5.3, -4.1, 3.3]], np.float32),
                    np.array([1.6, 0.7, 1.3], np.float32),
                ],
                lambda a, b: fmod(a, b),
                torch.fmod,
                name="broadcast",
            ),
            Sample(
                [np.array([2.5, -3.5, 7.0, 1.0], np.float32)],
                lambda a: a % 3,
                lambda a: torch.fmod(a, 3),
                name="dunder_scalar",
            ),
            Sample(
                [np.array([7, -7, 9, 3], np.int32), np.array([3, 3, -4, 5], np.int32)],
                lambda a, b: fmod(a, b),
                torch.fmod,
                name="int",
            ),
        ],
    )
)


def fmod(lhs: Tensor, rhs: Tensor) -> Tensor:
    """Remainder of lhs / rhs with the sign of lhs (C fmod), broadcasting."""
    return create_op(FMOD, list(coerce_pair(lhs, rhs)))[0]


def _minus_one(e: Tensor) -> Tensor:
    if isinstance(e, Constant):  # fold e - 1 at build time for the common constant exponent
        return constant(np.asarray(e._data) - 1, e.dtype)
    return _arithmetic()[3](e, 1)  # sub


def _pow_grad(ctx):
    from .unary import log

    _, mul, _, _ = _arithmetic()
    g = ctx.grad_output(0)
    t, e = ctx.op.inputs
    base, expo = ctx.input(0), ctx.input(1)
    gt = ge = None
    if ctx.requires_grad(0):
        gt = unbroadcast(mul(g, mul(expo, pow(base, _minus_one(expo)))), t.shape)
    if ctx.requires_grad(1):
        ge = unbroadcast(mul(g, mul(ctx.output(0), log(base))), e.shape)
    return [gt, ge]


POW = register(
    OpDef(
        "Pow",
        binary_infer,
        torch.pow,
        grad=_pow_grad,
        out_name="pow_out",
        pointwise=True,
        samples=lambda: [
            Sample(
                [rand(3, 4, low=0.5, high=2.0, seed=60), rand(3, 4, seed=61)],
                lambda a, b: pow(a, b),
                torch.pow,
            ),
            Sample(
                [rand(2, 3, low=0.5, high=2.0, seed=62), rand(3, seed=63)],
                lambda a, b: pow(a, b),
                torch.pow,
                name="broadcast",
            ),
            Sample(
                [rand(3, 4, seed=64)],
                lambda a: pow(a, 3),
                lambda a: torch.pow(a, 3),
                name="int_exponent",
            ),
            Sample(
                [rand(3, 4, low=0.5, high=2.0, seed=65)],
                lambda a: a**0.5,
                lambda a: a**0.5,
                name="dunder",
            ),
            Sample([rand(4, seed=66)], lambda a: 2**a, lambda a: 2**a, name="rpow"),
        ],
    )
)


def pow(t: Tensor, e: float | Tensor) -> Tensor:
    """t ** e, broadcasting; a python exponent becomes a constant of t's dtype."""
    return create_op(POW, list(coerce_pair(t, e)))[0]
