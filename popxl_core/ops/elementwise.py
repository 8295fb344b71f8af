"""Elementwise arithmetic and math ops (binary ops broadcast like numpy)."""

from __future__ import annotations

import functools

import numpy as np
import torch

from .. import dtypes
from ..tensor import Constant, Tensor, constant
from ._utils import as_tensor, broadcast_shapes, coerce_pair, rand, same_dtype, spec, unbroadcast
from .forms import binary_direct, binary_foreach, unary_foreach
from .registry import OpDef, Sample, create_op, register

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


def binary_infer(ins, **attrs):
    same_dtype(*ins)
    return [spec(broadcast_shapes(ins[0].shape, ins[1].shape), ins[0].dtype)]


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
        foreach=binary_foreach(torch._foreach_add, torch._foreach_add_, commutative=True),
        out_kernel=torch.add,
        direct=binary_direct("torch.add"),
    )
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


def add(lhs: Tensor, rhs: Tensor) -> Tensor:
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
        # a scalar right operand is not grouped (no SL / LS form)
        foreach=binary_foreach(
            torch._foreach_sub, torch._foreach_sub_, commutative=False, scalar_rhs=False
        ),
        out_kernel=torch.sub,
        direct=binary_direct("torch.sub"),
        samples=lambda: (
            _binary_samples(lambda a, b: sub(a, b), torch.sub, seed=20)
            + [Sample([rand(3, 2, seed=26)], lambda a: 2 - a, lambda a: 2 - a, name="rsub_scalar")]
        ),
    )
)
MUL = register(
    OpDef(
        "Mul",
        binary_infer,
        torch.mul,
        grad=_mul_grad,
        out_name="mul_out",
        foreach=binary_foreach(torch._foreach_mul, torch._foreach_mul_, commutative=True),
        out_kernel=torch.mul,
        direct=binary_direct("torch.mul"),
        samples=lambda: (
            _binary_samples(lambda a, b: mul(a, b), torch.mul, seed=30)
            + [Sample([rand(3, 2, seed=36)], lambda a: a * 2, lambda a: a * 2, name="scalar")]
        ),
    )
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
        # float32 only, where the kernel is torch.div
        foreach=binary_foreach(torch._foreach_div, torch._foreach_div_, commutative=False),
        out_kernel=torch.div,
        samples=lambda: _binary_samples(
            lambda a, b: div(a, b), torch.div, rlow=0.5, rhigh=2.0, seed=40
        ),
    )
)


def sub(lhs: Tensor, rhs: Tensor) -> Tensor:
    """lhs - rhs, broadcasting."""
    return create_op(SUB, list(coerce_pair(lhs, rhs)))[0]


def mul(lhs: Tensor, rhs: Tensor) -> Tensor:
    """lhs * rhs, broadcasting."""
    return create_op(MUL, list(coerce_pair(lhs, rhs)))[0]


def div(lhs: Tensor, rhs: Tensor) -> Tensor:
    """lhs / rhs, broadcasting (integer tensors divide with truncation, as on the IPU)."""
    return create_op(DIV, list(coerce_pair(lhs, rhs)))[0]


NEG = register(
    OpDef(
        "Neg",
        lambda ins: [ins[0]],
        torch.neg,
        out_name="neg_out",
        foreach=unary_foreach(torch._foreach_neg, torch._foreach_neg_),
        grad=lambda ctx: [negate(ctx.grad_output(0))],
        samples=lambda: [
            Sample([rand(3, 4, seed=50)], lambda a: negate(a), torch.neg),
            Sample([rand(2, seed=51)], lambda a: -a, torch.neg, name="dunder"),
        ],
    )
)


def negate(t: Tensor) -> Tensor:
    """-t."""
    return create_op(NEG, [t])[0]


# fmod, pow -----------------------------------------------------------------------------------


def _fmod_grad(ctx):
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
    return sub(e, 1)


def _pow_grad(ctx):
    from .unary import log

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


def maximum(*ts: Tensor) -> Tensor:
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


def where(condition: Tensor, lhs: Tensor, rhs: Tensor) -> Tensor:
    """Elementwise ``lhs if condition else rhs``, broadcasting all three."""
    if not isinstance(condition, Tensor):
        raise TypeError(f"where: condition must be a bool popxl.Tensor, got {condition!r}.")
    return create_op(WHERE, [condition, *coerce_pair(lhs, rhs)])[0]
