"""Arithmetic, comparisons, logic, math functions, where/masked_fill/clamp (casts and copies:
`casts`).

Binary ops follow torch's type promotion (see `_common.promote`); an op on two python values
(shape arithmetic) is computed in python.
"""

from __future__ import annotations

import operator
from typing import Any, Callable

import torch

import popxl_core as popxl
from popxl_core import ops

from ..lowering import lowers
from ._common import const, is_t, pdtype, promote
from .aten_kernels import (
    eager_stride,
    torch_call,
    torch_kernel_in_eager_layout,
    torch_unary,
)

__all__: list = []


def _binary(fn: Callable, py: Callable) -> Callable:
    def lower(ctx, a: Any, b: Any, **kwargs) -> Any:
        if not is_t(a) and not is_t(b):
            return py(a, b)
        return fn(*promote(a, b), **kwargs)

    return lower


def _eager_numerics() -> bool:
    return popxl.gcg().ir.numerics == "torch"


def _eager_kernel(ctx, fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` (the node's own operands, in the node's order) as torch's kernel,
    on eager's layout where an operand was a strided view in eager (`EagerLayout`: ATen's
    vectorised loops compute each row's tail with the scalar function, which for pow rounds
    otherwise), forward and backward."""
    if any(eager_stride(a) for a in ctx.node.args) and _own_call(ctx, fn):
        return torch_kernel_in_eager_layout(ctx, fn, *args, **kwargs)
    return torch_call(fn, *args, **kwargs)


def _own_call(ctx, fn: Callable) -> bool:
    """Whether ``ctx.node`` is the call being lowered (a layer's lowering may lower its
    arithmetic under the layer's own node, whose arguments are not these operands)."""
    node = ctx.node
    return node.op in ("call_function", "call_method") and _TARGETS.get(node.target) is fn


def _add_sub(fn: Callable, op: Callable, py: Callable) -> Callable:
    """``a + alpha * b``: torch's kernel where alpha is not 1 (its vectorised loop fuses the
    multiply and the add, one rounding); PopXL's ops under ``Options(numerics="ipu")``."""

    def lower(ctx, a: Any, b: Any, alpha: Any = 1) -> Any:
        if not is_t(a) and not is_t(b):
            return py(a, b * alpha)
        if alpha != 1 and is_t(a) and _eager_numerics():
            return _eager_kernel(ctx, fn, a, b, alpha=alpha)
        a, b = promote(a, b)
        return op(a, b if alpha == 1 else b * alpha)

    return lower


def _true_div(a, b, rounding_mode=None):
    if rounding_mode is not None:  # torch's kernel: exact for integers, eager's rounding
        return torch_call(torch.div, a, b, rounding_mode=rounding_mode)
    if not a.dtype.is_floating_point:
        a, b = ops.cast(a, popxl.float32), ops.cast(b, popxl.float32)
    return ops.div(a, b)


def _floor_div(a, b):
    return torch_call(torch.floor_divide, a, b)


def _remainder(a, b):
    # torch's % takes the sign of the divisor; its kernel is exact for integers too
    return torch_call(torch.remainder, a, b)


def _bitwise(logical: Callable, bitwise: Callable) -> Callable:
    """The logical op on bools; torch's bitwise kernel on integers."""

    def build(a, b):
        return logical(a, b) if a.dtype == popxl.bool else torch_call(bitwise, a, b)

    return build


def _logical(build: Callable) -> Callable:
    """torch.logical_*: any nonzero value is true."""

    def lower(a, b):
        a, b = (x if x.dtype == popxl.bool else ops.cast(x, popxl.bool) for x in (a, b))
        return build(a, b)

    return lower


def _minimum(a, b):
    # torch's kernel: a tie splits the gradient in halves and a NaN in either operand wins,
    # which a select of one operand does not do
    return torch_call(torch.minimum, a, b)


def _maximum(a, b):
    return torch_call(torch.maximum, a, b)


def _ne(a, b):
    return ops.logical_not(ops.equal(a, b))


def _le(a, b):
    return ops.logical_not(ops.greater(a, b))


def _ge(a, b):
    return ops.logical_not(ops.less(a, b))


_BINARY: dict[tuple, tuple[Callable[..., Any], Callable[..., Any]]] = {
    (operator.mul, operator.imul, torch.mul, "mul", "mul_", "__mul__", "__imul__"): (
        ops.mul,
        operator.mul,
    ),
    (
        operator.truediv,
        operator.itruediv,
        torch.div,
        torch.true_divide,
        "div",
        "div_",
        "true_divide",
        "__truediv__",
    ): (_true_div, operator.truediv),
    (operator.floordiv, torch.floor_divide, "floor_divide"): (_floor_div, operator.floordiv),
    (operator.mod, torch.remainder, "remainder"): (_remainder, operator.mod),
    (torch.maximum, "maximum"): (_maximum, max),
    (torch.minimum, "minimum"): (_minimum, min),
    (operator.eq, torch.eq, "eq"): (ops.equal, operator.eq),
    (operator.ne, torch.ne, "ne"): (_ne, operator.ne),
    (operator.lt, torch.lt, "lt", torch.less): (ops.less, operator.lt),
    (operator.gt, torch.gt, "gt", torch.greater): (ops.greater, operator.gt),
    (operator.le, torch.le, "le"): (_le, operator.le),
    (operator.ge, torch.ge, "ge"): (_ge, operator.ge),
    (operator.and_, torch.bitwise_and, "__and__", "bitwise_and"): (
        _bitwise(ops.logical_and, torch.bitwise_and),
        operator.and_,
    ),
    (operator.xor, torch.bitwise_xor, "__xor__", "bitwise_xor"): (
        _bitwise(_ne, torch.bitwise_xor),
        operator.xor,
    ),
    (operator.or_, torch.bitwise_or, "__or__", "bitwise_or"): (
        _bitwise(ops.logical_or, torch.bitwise_or),
        operator.or_,
    ),
    (torch.logical_and, "logical_and"): (_logical(ops.logical_and), operator.and_),
    (torch.logical_xor, "logical_xor"): (_logical(_ne), operator.xor),
    (torch.logical_or, "logical_or"): (_logical(ops.logical_or), operator.or_),
}
for _targets, (_fn, _py) in _BINARY.items():
    lowers(*_targets)(_binary(_fn, _py))

_ADD = (operator.add, operator.iadd, torch.add, "add", "add_", "__add__", "__iadd__")
_SUB = (operator.sub, operator.isub, torch.sub, "sub", "sub_", "__sub__", "__isub__")
_POW = (operator.pow, torch.pow, "pow", "__pow__")
_TARGETS = {
    t: fn for ts, fn in ((_ADD, torch.add), (_SUB, torch.sub), (_POW, torch.pow)) for t in ts
}
lowers(*_ADD)(_add_sub(torch.add, ops.add, operator.add))
lowers(*_SUB)(_add_sub(torch.sub, ops.sub, operator.sub))


@lowers(*_POW)
def _pow(ctx, a, b):
    """torch's kernel, on eager's layout where eager's operand is a strided view (pow's scalar
    tail rounds otherwise than its vectorised loop); a scalar's power of a tensor as torch's
    kernel too (its gradient's log of the base). PopXL's Pow under ``numerics="ipu"``."""
    if not is_t(a) and not is_t(b):
        return a**b
    if is_t(a) and not is_t(b) and a.dtype.is_floating_point:
        return a if b == 1 else _pow_scalar(ctx, a, b)
    if _eager_numerics():
        return _eager_kernel(ctx, torch.pow, a, b)
    a, b = promote(a, b)
    return ops.pow(a, b)


def _pow_scalar(ctx, a, e):
    # torch's own kernel and gradient: x.pow(2) as x * x would give x two gradient terms,
    # summed in another order than eager's one `2 * x * grad` where x has other uses too
    # (RMSNorm's x * rsqrt(x.pow(2).mean()): the last bit of its input gradient)
    if _eager_numerics():
        return _eager_kernel(ctx, torch.pow, a, e)
    return torch_call(torch.pow, a, e)


@lowers(torch.rsub)
def _rsub(ctx, a, b, alpha=1):
    a, b = promote(a, b)
    return ops.sub(b, a if alpha == 1 else a * alpha)


@lowers(operator.neg, torch.neg, "neg", "__neg__", torch.negative)
def _neg(ctx, a):
    return -a if not is_t(a) else ops.negate(a)


@lowers(operator.pos)
def _pos(ctx, a):
    return a


@lowers(operator.invert, torch.logical_not, "logical_not", torch.bitwise_not)
def _not(ctx, a):
    if not is_t(a):
        return not a if isinstance(a, bool) else ~a
    if a.dtype != popxl.bool and ctx.node.target in (
        operator.invert,
        torch.bitwise_not,
        "__invert__",
        "bitwise_not",
    ):
        return torch_call(torch.bitwise_not, a)  # ~ on integers flips bits
    return ops.logical_not(ops.cast(a, popxl.bool) if a.dtype != popxl.bool else a)


def _float_unary(fn: Callable) -> Callable:
    def lower(ctx, a):
        if not a.dtype.is_floating_point:
            a = ops.cast(a, popxl.float32)
        return fn(a)

    return lower


_UNARY: dict[tuple, Callable[..., Any]] = {
    (torch.exp, "exp"): ops.exp,
    (torch.log, "log"): ops.log,
    (torch.log2, "log2"): torch_unary(torch.ops.aten.log2.default),
    (torch.sqrt, "sqrt"): ops.sqrt,
    (torch.sin, "sin"): ops.sin,
    (torch.cos, "cos"): ops.cos,
    # compositions of PopXL ops would round differently from these: torch's own kernels
    (torch.rsqrt, "rsqrt"): torch_unary(torch.ops.aten.rsqrt.default),
    (torch.reciprocal, "reciprocal"): torch_unary(torch.ops.aten.reciprocal.default),
    (torch.log1p, "log1p"): torch_unary(torch.ops.aten.log1p.default),
    (torch.expm1, "expm1"): torch_unary(torch.ops.aten.expm1.default),
    (torch.log10, "log10"): torch_unary(torch.ops.aten.log10.default),
}
for _targets, _fn in _UNARY.items():
    lowers(*_targets)(_float_unary(_fn))


@lowers(torch.abs, "abs", operator.abs)
def _abs(ctx, a):
    return abs(a) if not is_t(a) else ops.abs(a)


@lowers(torch.square, "square")
def _square(ctx, a):
    return ops.mul(a, a)


@lowers(torch.floor, "floor")
def _floor(ctx, a):
    return ops.floor(a) if a.dtype.is_floating_point else a


@lowers(torch.ceil, "ceil")
def _ceil(ctx, a):
    return ops.ceil(a) if a.dtype.is_floating_point else a


@lowers(torch.sign, "sign")
def _sign(ctx, a):
    return ops.sign(a)


@lowers(torch.where, "where")
def _where(ctx, cond, a=None, b=None):
    if a is None:
        raise NotImplementedError(
            "torch.where(cond) with one argument returns a data-dependent "
            "number of indices, which a static IPU graph cannot hold"
        )
    if not is_t(a) and not is_t(b):
        dt = (
            pdtype(torch.get_default_dtype())
            if isinstance(a, float) or isinstance(b, float)
            else popxl.int32
        )
        a = const(a, dt)
    a, b = promote(a, b)
    return ops.where(cond, a, b)


@lowers(torch.masked_fill, "masked_fill", "masked_fill_")
def _masked_fill(ctx, t, mask, value):
    value = value if is_t(value) else const(value, t.dtype)
    if value.dtype != t.dtype:
        value = ops.cast(value, t.dtype)
    return ops.where(mask, value, t)


# the one-sided spellings, each as the out-of-place function torch's kernel runs (the driver
# rebinds the updated tensor of an in-place one)
_ONE_SIDED = {
    "clamp_min": torch.clamp_min,
    "clamp_max": torch.clamp_max,
    "clamp_min_": torch.clamp_min,
    "clamp_max_": torch.clamp_max,
    torch.clamp_min: torch.clamp_min,
    torch.clamp_max: torch.clamp_max,
    torch.clamp_min_: torch.clamp_min,
    torch.clamp_max_: torch.clamp_max,
}


@lowers(
    torch.clamp,
    torch.clip,
    "clamp",
    "clip",
    "clamp_",
    *_ONE_SIDED,
)
def _clamp(ctx, t, *args, **kwargs):
    if ctx.node.target in _ONE_SIDED:  # torch's kernel: promotion, NaN, gradient
        return _out_of_place_kernel(ctx, _ONE_SIDED[ctx.node.target], t, *args, **kwargs)
    bounds = (list(args) + [kwargs.get("min"), kwargs.get("max")])[:2]
    lo = float("-inf") if bounds[0] is None else bounds[0]
    hi = float("inf") if bounds[1] is None else bounds[1]
    # torch's kernel also where Clip's rule is not torch's: a float bound raises an integer
    # tensor to float, and min > max gives max everywhere (Clip refuses it)
    if any(is_t(b) for b in bounds) or lo > hi or _raises_to_float(t, bounds):
        return _out_of_place_kernel(ctx, torch.clamp, t, *args, **kwargs)
    return ops.clip(t, lo, hi)


def _out_of_place_kernel(ctx, fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """torch's out-of-place ``fn`` for the node (also for ``x.clamp_()``: the driver rebinds
    the updated tensor; an in-place kernel would write into its input, a leaf in training)."""
    if any(eager_stride(a) for a in ctx.node.args):
        return torch_kernel_in_eager_layout(ctx, fn, *args, **kwargs)
    return torch_call(fn, *args, **kwargs)


def _raises_to_float(t, bounds) -> bool:
    return not t.dtype.is_floating_point and any(isinstance(b, float) for b in bounds)
