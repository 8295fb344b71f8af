"""Elementwise arithmetic: add, sub, mul, div, negate, identity (binary ops broadcast like
numpy). fmod and pow (fmod_pow.py), maximum and where (select.py) are re-exported here."""

from __future__ import annotations

import torch

from ..sim.speed import declare
from ..tensor import Tensor
from ._utils import (
    as_tensor,
    binary_infer,
    coerce_pair,
    rand,
    unbroadcast,
)
from .fmod_pow import fmod, pow
from .forms import binary_direct, binary_foreach, fold_elementwise, unary_foreach
from .registry import OpDef, Sample, create_op, register
from .select import maximum, where

__all__ = [
    "add",
    "add_",
    "div",
    "fmod",
    "identity",
    "maximum",
    "mul",
    "negate",
    "pow",
    "rename",
    "sub",
    "where",
]


def inplace_binary_infer(ins, **attrs):
    out = binary_infer(ins)[0]
    if out.shape != ins[0].shape:
        raise ValueError(
            f"in-place op cannot broadcast its first input {ins[0].shape} to {out.shape}"
        )
    return [ins[0]]


def _add_grad(ctx):
    g = ctx.grad_output(0)
    return [unbroadcast(g, ctx.op.inputs[0].shape), unbroadcast(g, ctx.op.inputs[1].shape)]


def _add_samples():
    return [
        Sample([rand(3, 4), rand(3, 4, seed=1)], lambda a, b: add(a, b), torch.add),
        Sample(
            [rand(2, 3, 4), rand(4, seed=2)], lambda a, b: add(a, b), torch.add, name="broadcast"
        ),
        Sample([rand(3, 1), rand(1, 5, seed=3)], lambda a, b: a + b, torch.add, name="both"),
    ]


def _add_inplace_kernel(a, b):
    return a.add_(b)


ADD = register(
    OpDef(
        "Add",
        binary_infer,
        torch.add,
        grad=_add_grad,
        samples=_add_samples,
        out_name="add_out",
    )
)
declare(
    ADD,
    foreach=binary_foreach(torch._foreach_add, torch._foreach_add_, commutative=True),
    out_kernel=torch.add,
    direct=binary_direct("torch.add"),
    replica_fold=fold_elementwise(exact=True),
)
ADD_LHS_INPLACE = register(
    OpDef(
        "AddLhsInplace",
        inplace_binary_infer,
        _add_inplace_kernel,
        grad=_add_grad,
        inplace=(0,),
        out_name="add_out",
        samples=lambda: [
            Sample([rand(3, 4), rand(4, seed=5)], lambda a, b: add_(a * 1.0, b), torch.add)
        ],
    )
)


def add(lhs: Tensor | float, rhs: Tensor | float) -> Tensor:
    """lhs + rhs, broadcasting."""
    return create_op(ADD, list(coerce_pair(lhs, rhs)))[0]


def add_(lhs: Tensor, rhs: Tensor) -> Tensor:
    """lhs += rhs in place; returns the updated alias of lhs."""
    return create_op(ADD_LHS_INPLACE, [lhs, as_tensor(rhs, lhs)])[0]


IDENTITY = register(
    OpDef(
        "Identity",
        lambda ins: [ins[0]],
        lambda x: x.clone(),
        grad=lambda ctx: [ctx.grad_output(0)],
        out_name="identity_out",
        samples=lambda: [Sample([rand(2, 3)], lambda x: identity(x), lambda x: x * 1)],
    )
)


def identity(t: Tensor, output_name: str | None = None) -> Tensor:
    """A copy of ``t`` (optionally with a new name)."""
    return create_op(IDENTITY, [t], out_names=[output_name] if output_name else None)[0]


rename = identity


# Binary arithmetic ---------------------------------------------------------------------------


def _sub_grad(ctx):
    g = ctx.grad_output(0)
    a, b = ctx.op.inputs
    return [
        unbroadcast(g, a.shape) if ctx.requires_grad(0) else None,
        unbroadcast(negate(g), b.shape) if ctx.requires_grad(1) else None,
    ]


def _mul_grad(ctx):
    g = ctx.grad_output(0)
    a, b = ctx.op.inputs
    return [
        unbroadcast(mul(g, ctx.input(1)), a.shape) if ctx.requires_grad(0) else None,
        unbroadcast(mul(g, ctx.input(0)), b.shape) if ctx.requires_grad(1) else None,
    ]


def _div_grad(ctx):
    g = ctx.grad_output(0)
    a, b = ctx.op.inputs
    ga = div(g, ctx.input(1))
    # d(a/b)/db = -(a/b)/b, rounded as torch's DivBackward rounds it: -g * ((a / b) / b)
    # (a / b is the forward's output; (g/b) * (a/b) is another rounding, 1 ulp off)
    gb = negate(mul(g, div(ctx.output(0), ctx.input(1)))) if ctx.requires_grad(1) else None
    return [
        unbroadcast(ga, a.shape) if ctx.requires_grad(0) else None,
        unbroadcast(gb, b.shape) if gb is not None else None,
    ]


def _binary_samples(fn, ref, low=-1.0, high=1.0, rlow=None, rhigh=None, seed=10):
    rlow = low if rlow is None else rlow
    rhigh = high if rhigh is None else rhigh
    return [
        Sample(
            [
                rand(3, 4, low=low, high=high, seed=seed),
                rand(3, 4, low=rlow, high=rhigh, seed=seed + 1),
            ],
            fn,
            ref,
        ),
        Sample(
            [
                rand(2, 3, 4, low=low, high=high, seed=seed + 2),
                rand(4, low=rlow, high=rhigh, seed=seed + 3),
            ],
            fn,
            ref,
            name="broadcast",
        ),
        Sample(
            [
                rand(3, 1, low=low, high=high, seed=seed + 4),
                rand(1, 5, low=rlow, high=rhigh, seed=seed + 5),
            ],
            fn,
            ref,
            name="both",
        ),
    ]


SUB = register(
    OpDef(
        "Sub",
        binary_infer,
        torch.sub,
        grad=_sub_grad,
        out_name="sub_out",
        samples=lambda: (
            _binary_samples(lambda a, b: sub(a, b), torch.sub, seed=20)
            + [Sample([rand(3, 2, seed=26)], lambda a: 2 - a, lambda a: 2 - a, name="rsub_scalar")]
        ),
    )
)
declare(
    SUB,
    # a scalar right operand is not grouped (no SL / LS form)
    foreach=binary_foreach(
        torch._foreach_sub, torch._foreach_sub_, commutative=False, scalar_rhs=False
    ),
    out_kernel=torch.sub,
    direct=binary_direct("torch.sub"),
    replica_fold=fold_elementwise(exact=True),
)
MUL = register(
    OpDef(
        "Mul",
        binary_infer,
        torch.mul,
        grad=_mul_grad,
        out_name="mul_out",
        samples=lambda: (
            _binary_samples(lambda a, b: mul(a, b), torch.mul, seed=30)
            + [Sample([rand(3, 2, seed=36)], lambda a: a * 2, lambda a: a * 2, name="scalar")]
        ),
    )
)
declare(
    MUL,
    foreach=binary_foreach(torch._foreach_mul, torch._foreach_mul_, commutative=True),
    out_kernel=torch.mul,
    direct=binary_direct("torch.mul"),
    replica_fold=fold_elementwise(exact=True),
)


def _div_kernel(a, b):
    if a.dtype.is_floating_point:
        return torch.div(a, b)
    return torch.div(a, b, rounding_mode="trunc")  # integer division keeps the integer dtype


DIV = register(
    OpDef(
        "Div",
        binary_infer,
        _div_kernel,
        grad=_div_grad,
        out_name="div_out",
        samples=lambda: _binary_samples(
            lambda a, b: div(a, b), torch.div, rlow=0.5, rhigh=2.0, seed=40
        ),
    )
)
declare(
    DIV,
    # float32 only, where the kernel is torch.div
    foreach=binary_foreach(torch._foreach_div, torch._foreach_div_, commutative=False),
    out_kernel=torch.div,
)


def sub(lhs: Tensor | float, rhs: Tensor | float) -> Tensor:
    """lhs - rhs, broadcasting."""
    return create_op(SUB, list(coerce_pair(lhs, rhs)))[0]


def mul(lhs: Tensor | float, rhs: Tensor | float) -> Tensor:
    """lhs * rhs, broadcasting."""
    return create_op(MUL, list(coerce_pair(lhs, rhs)))[0]


def div(lhs: Tensor | float, rhs: Tensor | float) -> Tensor:
    """lhs / rhs, broadcasting (integer tensors divide with truncation, as on the IPU)."""
    return create_op(DIV, list(coerce_pair(lhs, rhs)))[0]


NEG = register(
    OpDef(
        "Neg",
        lambda ins: [ins[0]],
        torch.neg,
        out_name="neg_out",
        grad=lambda ctx: [negate(ctx.grad_output(0))],
        samples=lambda: [
            Sample([rand(3, 4, seed=50)], lambda a: negate(a), torch.neg),
            Sample([rand(2, seed=51)], lambda a: -a, torch.neg, name="dunder"),
        ],
    )
)
declare(NEG, foreach=unary_foreach(torch._foreach_neg, torch._foreach_neg_))


def negate(t: Tensor) -> Tensor:
    """-t."""
    return create_op(NEG, [t])[0]
