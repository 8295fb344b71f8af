"""Unary elementwise math: abs, sqrt, exp, log, trigonometry, rounding.

clip (clip.py), cast and detach (cast.py) and increment_mod (increment_mod.py) are re-exported
here, where popxl has them. Activations (relu, gelu, swish, sigmoid) live in activations.py.
"""

from __future__ import annotations

import torch

from ..sim.speed import declare
from ..tensor import Tensor, constant
from ._unary_common import float_spec, same_spec, unary_op, unary_samples
from ._utils import rand
from .cast import cast, detach, detach_
from .clip import clamp, clip
from .forms import unary_foreach
from .increment_mod import increment_mod, increment_mod_
from .registry import OpDef, Sample, create_op, no_grad, register

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


ABS = unary_op("Abs", same_spec, torch.abs, _abs_grad, lambda x: abs(x), seed=200)
SQRT = unary_op(
    "Sqrt",
    float_spec,
    torch.sqrt,
    _sqrt_grad,
    lambda x: sqrt(x),
    0.1,
    4.0,
    202,
)
declare(
    SQRT,
    foreach=unary_foreach(torch._foreach_sqrt, torch._foreach_sqrt_, writes_input=True),
    out_kernel=torch.sqrt,
)
EXP = unary_op(
    "Exp", float_spec, torch.exp, _exp_grad, lambda x: exp(x), -2.0, 2.0, 204, pointwise=True
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
SIN = unary_op(
    "Sin", float_spec, torch.sin, _sin_grad, lambda x: sin(x), -3.0, 3.0, 212, pointwise=True
)
COS = unary_op(
    "Cos", float_spec, torch.cos, _cos_grad, lambda x: cos(x), -3.0, 3.0, 214, pointwise=True
)
TANH = unary_op(
    "Tanh", float_spec, torch.tanh, _tanh_grad, lambda x: tanh(x), -2.0, 2.0, 216, pointwise=True
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
CEIL = unary_op("Ceil", float_spec, torch.ceil, no_grad, lambda x: ceil(x), -3.0, 3.0, 218)
FLOOR = unary_op("Floor", float_spec, torch.floor, no_grad, lambda x: floor(x), -3.0, 3.0, 220)
SIGN = unary_op("Sign", same_spec, torch.sign, no_grad, lambda x: sign(x), seed=222)


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
