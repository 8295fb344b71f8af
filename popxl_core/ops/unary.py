"""Unary elementwise math: abs, sqrt, exp, log, trigonometry, rounding, clip, cast, detach,
increment_mod. Activations (relu, gelu, swish, sigmoid) live in activations.py."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from .. import dtypes
from ..tensor import Tensor, constant
from ._dtype_rules import checked_float_to_int, floating
from ._utils import rand, spec
from .forms import unary_foreach
from .registry import OpDef, Sample, create_op, register

__all__ = [
    "abs",
    "cast",
    "ceil",
    "clamp",
    "clip",
    "cos",
    "detach",
    "detach_",
    "exp",
    "exp_",
    "floor",
    "increment_mod",
    "increment_mod_",
    "log",
    "log2",
    "sign",
    "sin",
    "sqrt",
    "tanh",
]


def same_spec(ins, **attrs):
    return [ins[0]]


float_spec = floating(same_spec)  # exp, log, sqrt, trigonometry, rounding: float only in PopXL


def unary_samples(
    build: Callable, ref: Callable, low: float = -1.0, high: float = 1.0, seed: int = 0
) -> Callable:
    """Two samples (a matrix and a rank-3 tensor) with data in [low, high)."""
    return lambda: [
        Sample([rand(3, 4, low=low, high=high, seed=seed)], build, ref),
        Sample([rand(2, 3, 5, low=low, high=high, seed=seed + 1)], build, ref, name="rank3"),
    ]


def no_grad(ctx):
    """Piecewise-constant ops (ceil, floor, sign): the gradient is zero almost everywhere."""
    return [None] * len(ctx.op.inputs)


def _g():
    from .elementwise import div, mul, negate, sub

    return mul, div, sub, negate


def _abs_grad(ctx):
    mul, *_ = _g()
    return [mul(ctx.grad_output(0), sign(ctx.input(0)))]


def _sqrt_grad(ctx):
    mul, div, *_ = _g()
    return [div(ctx.grad_output(0), mul(ctx.output(0), 2.0))]


def _exp_grad(ctx):
    mul, *_ = _g()
    return [mul(ctx.grad_output(0), ctx.output(0))]


def _log_grad(ctx):
    _, div, *_ = _g()
    return [div(ctx.grad_output(0), ctx.input(0))]


def _sin_grad(ctx):
    mul, *_ = _g()
    return [mul(ctx.grad_output(0), cos(ctx.input(0)))]


def _cos_grad(ctx):
    mul, _, _, negate = _g()
    return [negate(mul(ctx.grad_output(0), sin(ctx.input(0))))]


def _tanh_grad(ctx):
    # eager's own backward kernel, g * (1 - y * y) in one pass: bit for bit with torch
    return [create_op(TANH_GRAD, [ctx.grad_output(0), ctx.output(0)])[0]]


def _tanh_grad_grad(ctx):
    """TanhGrad(g, y) = g (1 - y^2): linear in g; -2 g y in y."""
    mul, _, _, negate = _g()
    gg = ctx.grad_output(0)
    g, y = ctx.input(0), ctx.input(1)
    return [create_op(TANH_GRAD, [gg, y])[0], negate(mul(mul(gg, g), mul(y, 2.0)))]


def _tanh_grad_infer(ins):
    if ins[0].shape != ins[1].shape or ins[0].dtype != ins[1].dtype:
        raise ValueError(f"gradient {ins[0]} and output {ins[1]} specs differ")
    return [ins[0]]


def _tanh_grad_samples():
    """TanhGrad against autograd of torch.tanh (bitwise), and its own gradient (tanh's
    double backward) against autograd of torch's tanh_backward."""
    g, x = rand(3, 4, seed=220), rand(3, 4, low=-2.0, high=2.0, seed=221)

    def vjp(g, x):
        with torch.enable_grad():
            x = x.detach().requires_grad_()
            return torch.autograd.grad(torch.tanh(x), x, g)[0]

    def build(g, x):
        return create_op(TANH_GRAD, [g, tanh(x)])[0]

    return [
        Sample([g, x], build, vjp, grad=False, rtol=0.0, atol=0.0),
        Sample(
            [g, x],
            build,
            lambda g, x: torch.ops.aten.tanh_backward(g, torch.tanh(x)),
            name="double_backward",
        ),
    ]


def _exp_inplace_kernel(x):
    return x.exp_()


ABS = register(
    OpDef(
        "Abs",
        same_spec,
        torch.abs,
        grad=_abs_grad,
        samples=unary_samples(lambda x: abs(x), torch.abs, seed=200),
    )
)
SQRT = register(
    OpDef(
        "Sqrt",
        float_spec,
        torch.sqrt,
        grad=_sqrt_grad,
        foreach=unary_foreach(torch._foreach_sqrt, torch._foreach_sqrt_, writes_input=True),
        out_kernel=torch.sqrt,
        samples=unary_samples(lambda x: sqrt(x), torch.sqrt, 0.1, 4.0, seed=202),
    )
)
EXP = register(
    OpDef(
        "Exp",
        float_spec,
        torch.exp,
        pointwise=True,
        grad=_exp_grad,
        samples=unary_samples(lambda x: exp(x), torch.exp, -2.0, 2.0, seed=204),
    )
)
EXP_INPLACE = register(
    OpDef(
        "ExpInplace",
        float_spec,
        _exp_inplace_kernel,
        grad=_exp_grad,
        pointwise=True,
        inplace=(0,),
        out_name="exp_out",
        samples=unary_samples(lambda x: exp_(x * 1.0), torch.exp, -2.0, 2.0, seed=206),
    )
)
LOG = register(
    OpDef(
        "Log",
        float_spec,
        torch.log,
        grad=_log_grad,
        pointwise=True,
        samples=lambda: (
            unary_samples(lambda x: log(x), torch.log, 0.1, 4.0, seed=208)()
            + [
                Sample(
                    [rand(3, 4, low=0.1, high=8.0, seed=210)],
                    lambda x: log2(x),
                    torch.log2,
                    name="log2",
                )
            ]
        ),
    )
)
SIN = register(
    OpDef(
        "Sin",
        float_spec,
        torch.sin,
        pointwise=True,
        grad=_sin_grad,
        samples=unary_samples(lambda x: sin(x), torch.sin, -3.0, 3.0, seed=212),
    )
)
COS = register(
    OpDef(
        "Cos",
        float_spec,
        torch.cos,
        pointwise=True,
        grad=_cos_grad,
        samples=unary_samples(lambda x: cos(x), torch.cos, -3.0, 3.0, seed=214),
    )
)
TANH = register(
    OpDef(
        "Tanh",
        float_spec,
        torch.tanh,
        pointwise=True,
        grad=_tanh_grad,
        samples=unary_samples(lambda x: tanh(x), torch.tanh, -2.0, 2.0, seed=216),
    )
)
TANH_GRAD = register(
    OpDef(
        "TanhGrad",
        _tanh_grad_infer,
        torch.ops.aten.tanh_backward,
        grad=_tanh_grad_grad,
        samples=_tanh_grad_samples,
    )
)
CEIL = register(
    OpDef(
        "Ceil",
        float_spec,
        torch.ceil,
        grad=no_grad,
        samples=unary_samples(lambda x: ceil(x), torch.ceil, -3.0, 3.0, seed=218),
    )
)
FLOOR = register(
    OpDef(
        "Floor",
        float_spec,
        torch.floor,
        grad=no_grad,
        samples=unary_samples(lambda x: floor(x), torch.floor, -3.0, 3.0, seed=220),
    )
)
SIGN = register(
    OpDef(
        "Sign",
        same_spec,
        torch.sign,
        grad=no_grad,
        samples=unary_samples(lambda x: sign(x), torch.sign, seed=222),
    )
)


def abs(t: Tensor) -> Tensor:
    """|t| elementwise."""
    return create_op(ABS, [t])[0]


def sqrt(t: Tensor) -> Tensor:
    """Square root elementwise."""
    return create_op(SQRT, [t])[0]


def exp(t: Tensor) -> Tensor:
    """e ** t elementwise."""
    return create_op(EXP, [t])[0]


def exp_(t: Tensor) -> Tensor:
    """t <- e ** t in place; returns the updated alias of t."""
    return create_op(EXP_INPLACE, [t])[0]


def log(t: Tensor) -> Tensor:
    """Natural logarithm elementwise."""
    return create_op(LOG, [t])[0]


def log2(t: Tensor) -> Tensor:
    """Base-2 logarithm, built like popxl as log(t) / log(2) (no op type of its own)."""
    from .elementwise import div

    return div(log(t), log(constant(2.0, t.dtype)))


def sin(t: Tensor) -> Tensor:
    """Sine elementwise."""
    return create_op(SIN, [t])[0]


def cos(t: Tensor) -> Tensor:
    """Cosine elementwise."""
    return create_op(COS, [t])[0]


def tanh(t: Tensor) -> Tensor:
    """Hyperbolic tangent elementwise."""
    return create_op(TANH, [t])[0]


def ceil(t: Tensor) -> Tensor:
    """Round up to the nearest integer, elementwise."""
    return create_op(CEIL, [t])[0]


def floor(t: Tensor) -> Tensor:
    """Round down to the nearest integer, elementwise."""
    return create_op(FLOOR, [t])[0]


def sign(t: Tensor) -> Tensor:
    """-1, 0 or 1 by the sign of t, elementwise."""
    return create_op(SIGN, [t])[0]


# clip ----------------------------------------------------------------------------------------


def _clip_infer(ins, min: float, max: float):
    if min > max:
        raise ValueError(f"clip min ({min}) is greater than max ({max})")
    return [ins[0]]


def _clip_kernel(x, min: float, max: float):
    lo = None if min == -math.inf else min
    hi = None if max == math.inf else max
    if lo is None and hi is None:
        return x.clone()
    return torch.clamp(x, lo, hi).to(x.dtype)


def _clip_grad(ctx):
    from .elementwise import where
    from .logical import equal

    # The gradient passes exactly where clipping left the value unchanged (bounds included).
    x = ctx.input(0)
    return [where(equal(x, ctx.output(0)), ctx.grad_output(0), 0.0)]


CLIP = register(
    OpDef(
        "Clip",
        _clip_infer,
        _clip_kernel,
        grad=_clip_grad,
        samples=lambda: [
            Sample(
                [rand(3, 4, low=-2.0, high=2.0, seed=230)],
                lambda x: clip(x, -0.5, 0.8),
                lambda x: torch.clamp(x, -0.5, 0.8),
            ),
            Sample(
                [rand(2, 6, low=-2.0, high=2.0, seed=231)],
                lambda x: clamp(x, min=0.1),
                lambda x: torch.clamp(x, min=0.1),
                name="min_only",
            ),
            Sample(
                [np.array([-7, 3, 12, 5], np.int32)],
                lambda x: clip(x, 0, 6),
                lambda x: torch.clamp(x, 0, 6),
                name="int",
            ),
        ],
    )
)


def clip(t: Tensor, min: float = float("-inf"), max: float = float("inf")) -> Tensor:
    """Clamp t into [min, max] elementwise."""
    return create_op(CLIP, [t], {"min": float(min), "max": float(max)})[0]


clamp = clip


# cast ----------------------------------------------------------------------------------------


def _cast_infer(ins, data_type):
    if data_type in (dtypes.float8_143, dtypes.float8_152):
        raise TypeError(
            f"cast to {data_type.name} is not a plain cast; use "
            "ops.pow2scale_cast_to_fp8 / pow2scale_cast_from_fp8"
        )
    return [spec(ins[0].shape, data_type)]


def _cast_kernel(x, data_type):
    return checked_float_to_int(x, data_type).to(data_type.as_torch())


def _cast_grad(ctx):
    src, g = ctx.op.inputs[0], ctx.grad_output(0)
    if not (src.dtype.is_floating_point and ctx.op.outputs[0].dtype.is_floating_point):
        return [None]
    return [cast(g, src.dtype)]


CAST = register(
    OpDef(
        "Cast",
        _cast_infer,
        _cast_kernel,
        grad=_cast_grad,
        fp16_in_fp32=False,
        samples=lambda: [
            Sample(
                [rand(3, 4, seed=240)],
                lambda x: cast(x, dtypes.float16),
                lambda x: x.to(torch.float16),
                rtol=1e-3,
                atol=1e-3,
                name="to_float16",
            ),
            Sample(
                [np.array([2.7, -3.2, 0.4, 9.9], np.float32)],
                lambda x: cast(x, dtypes.int32),
                lambda x: x.to(torch.int32),
                name="to_int32",
            ),
            Sample(
                [np.array([3, -1, 0, 7], np.int32)],
                lambda x: cast(x, dtypes.float32),
                lambda x: x.to(torch.float32),
                name="from_int32",
            ),
            Sample(
                [np.array([3, 0, -2], np.int32)],
                lambda x: cast(x, dtypes.bool),
                lambda x: x.to(torch.bool),
                name="to_bool",
            ),
        ],
    )
)


def cast(t: Tensor, data_type: dtypes.dtype) -> Tensor:
    """t converted to ``data_type`` (float to int truncates toward zero)."""
    if not isinstance(data_type, dtypes.dtype):
        raise TypeError(f"cast: data_type must be a popxl dtype, got {data_type!r}.")
    return create_op(CAST, [t], {"data_type": data_type})[0]


# detach --------------------------------------------------------------------------------------


def _alias(x):
    return x


DETACH = register(
    OpDef(
        "Detach",
        same_spec,
        _alias,
        grad=no_grad,
        view=True,
        fp16_in_fp32=False,
        stops_gradient=True,
        samples=lambda: [
            Sample([rand(3, 4, seed=250)], lambda x: x * detach(x), lambda x: x * x.detach())
        ],
    )
)
DETACH_INPLACE = register(
    OpDef(
        "DetachInplace",
        same_spec,
        _alias,
        grad=no_grad,
        inplace=(0,),
        fp16_in_fp32=False,
        out_name="detach_out",
        samples=lambda: [
            Sample([rand(3, 4, seed=252)], lambda x: x * detach_(x * 1.0), lambda x: x * x.detach())
        ],
    )
)


def detach(t: Tensor) -> Tensor:
    """t's value with no gradient flowing back through it."""
    return create_op(DETACH, [t])[0]


def detach_(t: Tensor) -> Tensor:
    """In-place detach; returns an alias of t through which no gradient flows."""
    return create_op(DETACH_INPLACE, [t])[0]


# increment_mod -------------------------------------------------------------------------------


def _incmod_infer(ins, increment: float, modulus: float):
    if modulus == 0:
        raise ValueError("increment_mod modulus must not be zero")
    return [ins[0]]


def _incmod_kernel(x, increment: float, modulus: float):
    return torch.fmod(x + increment, modulus).to(x.dtype)


def _incmod_inplace_kernel(x, increment: float, modulus: float):
    return x.copy_(_incmod_kernel(x, increment, modulus))


def _incmod_grad(ctx):
    return [ctx.grad_output(0)]  # the slope is 1 away from the wrap-around points


def _incmod_samples(fn: Callable, seed: int) -> Callable:
    return lambda: [
        Sample(
            [rand(3, 4, low=0.0, high=2.0, seed=seed)],
            lambda x: fn(x, 1.25, 2.5),
            lambda x: torch.fmod(x + 1.25, 2.5),
        ),
        Sample(
            [np.array([0, 3, 4, 6], np.int32)],
            lambda x: fn(x, 1, 5),
            lambda x: torch.fmod(x + 1, 5),
            name="int",
        ),
    ]


INCREMENT_MOD = register(
    OpDef(
        "IncrementMod",
        _incmod_infer,
        _incmod_kernel,
        grad=_incmod_grad,
        samples=_incmod_samples(lambda x, i, m: increment_mod(x, i, m), 260),
    )
)
INCREMENT_MOD_INPLACE = register(
    OpDef(
        "IncrementModInplace",
        _incmod_infer,
        _incmod_inplace_kernel,
        grad=_incmod_grad,
        inplace=(0,),
        out_name="incrementmod_out",
        samples=_incmod_samples(lambda x, i, m: increment_mod_(x * 1, i, m), 262),
    )
)


def increment_mod(t: Tensor, increment: float, modulus: float) -> Tensor:
    """fmod(t + increment, modulus) elementwise (a wrapping counter)."""
    return create_op(INCREMENT_MOD, [t], {"increment": increment, "modulus": modulus})[0]


def increment_mod_(t: Tensor, increment: float, modulus: float) -> Tensor:
    """t <- fmod(t + increment, modulus) in place; returns the updated alias of t."""
    return create_op(INCREMENT_MOD_INPLACE, [t], {"increment": increment, "modulus": modulus})[0]
