"""Comparisons and logical ops. They output bool tensors and have no gradient."""

from __future__ import annotations

import numpy as np
import torch

from .. import dtypes
from ..tensor import Tensor
from ._utils import broadcast_shapes, coerce_pair, rand, same_dtype, spec
from .registry import OpDef, Sample, create_op, no_grad, register

__all__ = [
    "equal",
    "greater",
    "greater_equal",
    "isfinite",
    "isinf",
    "isnan",
    "less",
    "logical_and",
    "logical_not",
    "logical_or",
]


def _compare_infer(ins, **attrs):
    same_dtype(*ins)
    return [spec(broadcast_shapes(ins[0].shape, ins[1].shape), dtypes.bool)]


def _unary_bool_infer(ins, **attrs):
    return [spec(ins[0].shape, dtypes.bool)]


def _bool_op(name: str, infer, kernel, samples) -> OpDef:
    """Register the op ``name``: a bool output, so no gradient."""
    return register(OpDef(name, infer, kernel, grad=no_grad, samples=samples))


def _pair_samples(fn, ref, seed: int):
    def data(*shape, s):
        # A coarse grid so that equal elements actually occur.
        return np.round(rand(*shape, seed=s) * 2).astype(np.float32)

    return lambda: [
        Sample([data(3, 4, s=seed), data(3, 4, s=seed + 1)], fn, ref, grad=False),
        Sample(
            [data(2, 3, 4, s=seed + 2), data(4, s=seed + 3)], fn, ref, grad=False, name="broadcast"
        ),
        Sample(
            [np.array([1, 5, -2], np.int32), np.array([1, 3, 4], np.int32)],
            fn,
            ref,
            grad=False,
            name="int",
        ),
    ]


def _bool_samples(fn, ref, seed: int):
    return lambda: [
        Sample([rand(3, 4, seed=seed) > 0, rand(3, 4, seed=seed + 1) > 0], fn, ref, grad=False),
        Sample(
            [rand(2, 4, seed=seed + 2) > 0, rand(4, seed=seed + 3) > 0],
            fn,
            ref,
            grad=False,
            name="broadcast",
        ),
    ]


def _special_values():
    return np.array([1.0, np.nan, np.inf, -np.inf, 0.0, -3.5], np.float32)


EQUAL = _bool_op(
    "Equal",
    _compare_infer,
    torch.eq,
    _pair_samples(lambda a, b: equal(a, b), torch.eq, 400),
)
GREATER = _bool_op(
    "Greater",
    _compare_infer,
    torch.gt,
    lambda: (
        _pair_samples(lambda a, b: greater(a, b), torch.gt, 410)()
        + [
            Sample(
                [rand(5, seed=415)],
                lambda a: less(a, 0.25),
                lambda a: a < 0.25,
                grad=False,
                name="less",
            ),
            Sample(
                [np.array([1.0, 2.0, 3.0], np.float32)],
                lambda a: greater_equal(a, 2.0),
                lambda a: a >= 2.0,
                grad=False,
                name="greater_equal",
            ),
        ]
    ),
)
AND = _bool_op(
    "And",
    _compare_infer,
    torch.logical_and,
    _bool_samples(lambda a, b: logical_and(a, b), torch.logical_and, 420),
)
OR = _bool_op(
    "Or",
    _compare_infer,
    torch.logical_or,
    _bool_samples(lambda a, b: logical_or(a, b), torch.logical_or, 430),
)
NOT = _bool_op(
    "Not",
    _unary_bool_infer,
    torch.logical_not,
    lambda: [
        Sample([rand(3, 4, seed=440) > 0], lambda a: logical_not(a), torch.logical_not, grad=False),
        Sample([rand(5, seed=441) > 0], lambda a: ~a, torch.logical_not, grad=False, name="dunder"),
    ],
)
IS_NAN = _bool_op(
    "IsNaN",
    _unary_bool_infer,
    torch.isnan,
    lambda: [
        Sample([_special_values()], lambda a: isnan(a), torch.isnan, grad=False),
        Sample(
            [_special_values()],
            lambda a: isfinite(a),
            torch.isfinite,
            grad=False,
            name="isfinite",
        ),
    ],
)
IS_INF = _bool_op(
    "IsInf",
    _unary_bool_infer,
    torch.isinf,
    lambda: [Sample([_special_values()], lambda a: isinf(a), torch.isinf, grad=False)],
)


def _as_bool(t: Tensor) -> Tensor:
    from .unary import cast

    return t if t.dtype is dtypes.bool else cast(t, dtypes.bool)


def equal(lhs: Tensor, rhs: Tensor) -> Tensor:
    """lhs == rhs elementwise (bool), broadcasting."""
    return create_op(EQUAL, list(coerce_pair(lhs, rhs)))[0]


def greater(input: Tensor, other: Tensor) -> Tensor:
    """input > other elementwise (bool), broadcasting."""
    return create_op(GREATER, list(coerce_pair(input, other)))[0]


def less(input: Tensor | float, other: Tensor | float) -> Tensor:
    """input < other, built as greater(other, input) (not a popxl op; for frontends)."""
    a, b = coerce_pair(input, other)
    return greater(b, a)


def greater_equal(input: Tensor | float, other: Tensor | float) -> Tensor:
    """input >= other, built as greater or equal (not a popxl op; for frontends)."""
    a, b = coerce_pair(input, other)
    return logical_or(greater(a, b), equal(a, b))


def logical_and(lhs: Tensor, rhs: Tensor) -> Tensor:
    """lhs and rhs elementwise; non-bool inputs are cast to bool first."""
    a, b = coerce_pair(lhs, rhs)
    return create_op(AND, [_as_bool(a), _as_bool(b)])[0]


def logical_or(lhs: Tensor, rhs: Tensor) -> Tensor:
    """lhs or rhs elementwise; non-bool inputs are cast to bool first."""
    a, b = coerce_pair(lhs, rhs)
    return create_op(OR, [_as_bool(a), _as_bool(b)])[0]


def logical_not(t: Tensor) -> Tensor:
    """not t elementwise; a non-bool input is cast to bool first."""
    return create_op(NOT, [_as_bool(t)])[0]


def isnan(t: Tensor) -> Tensor:
    """True where t is NaN."""
    return create_op(IS_NAN, [t])[0]


def isinf(t: Tensor) -> Tensor:
    """True where t is +inf or -inf."""
    return create_op(IS_INF, [t])[0]


def isfinite(t: Tensor) -> Tensor:
    """True where t is neither NaN nor infinite, built as not(isinf(t) or isnan(t))."""
    return logical_not(logical_or(isinf(t), isnan(t)))
