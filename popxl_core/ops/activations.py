"""Activations: relu, gelu (tanh approximation), geluerf (exact), swish, sigmoid, and the
extensions hardswish and hardsigmoid (torch's, for the torch frontend).

The gelu, swish, hard-swish/sigmoid and sigmoid gradients are single ops (GeluGrad, SwishGrad,
SigmoidGrad, ... as in PopART) rather than a dozen primitives: one pass over memory in the
backward graph, and torch's own backward kernels, so the numbers are eager's bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from ..sim.speed import declare
from ..tensor import Tensor
from ._dtype_rules import floating
from ._unary_common import float_spec, unary_op, unary_samples
from ._utils import rand, same_dtype
from .forms import fold_elementwise
from .registry import Cost, OpDef, Sample, create_op, register

__all__ = [
    "gelu",
    "gelu_",
    "geluerf",
    "geluerf_",
    "hardsigmoid",
    "hardsigmoid_",
    "hardswish",
    "hardswish_",
    "relu",
    "relu_",
    "sigmoid",
    "swish",
    "swish_",
]


def _flops(per_element: int) -> Callable:
    """Cost of an elementwise op that needs ``per_element`` flops per output element."""

    def cost(ins, outs, attrs) -> Cost:
        nbytes = sum(s.nbytes for s in ins) + sum(s.nbytes for s in outs)
        return Cost(per_element * sum(s.nelms for s in outs), nbytes)

    return cost


# relu, sigmoid (gradients from primitives) ---------------------------------------------------


def _relu_grad(ctx):
    # relu(x) > 0 exactly where x > 0, so the output (not the overwritten input) decides.
    return [create_op(RELU_GRAD, [ctx.grad_output(0), ctx.output(0)])[0]]


def _relu_grad_grad(ctx):
    # linear in dy with the same mask; piecewise constant in y (zero gradient)
    return [create_op(RELU_GRAD, [ctx.grad_output(0), ctx.input(1)])[0], None]


def _relu_grad_kernel(dy, y):
    # eager PyTorch's relu backward, one pass: dy where y > 0, else 0 (a NaN y passes dy)
    return torch.ops.aten.threshold_backward(dy, y, 0)


def _relu_grad_out(dy, y, out):
    """`_relu_grad_kernel` with ``out=`` (ATen's ``threshold_backward.grad_input``): the same
    bits, written into a dead gradient (sim/inplace.py)."""
    return torch.ops.aten.threshold_backward.grad_input(dy, y, 0, grad_input=out)


def _relu_grad_samples():
    """ReluGrad reads the forward output; bitwise against autograd of torch.relu (with zeros
    in x, where the gradient is 0), and its own gradient (relu's double backward) against
    autograd of torch's relu backward."""
    x = rand(3, 4, low=-3.0, high=3.0, seed=306)
    x[0, :2] = 0.0
    g = rand(3, 4, seed=305)

    def build(g, x):
        return create_op(RELU_GRAD, [g, relu(x)])[0]

    def relu_backward(g, x):  # differentiable in g, as autograd's double backward
        return torch.ops.aten.threshold_backward(g, torch.relu(x), 0)

    return [
        Sample([g, x], build, _grad_reference(torch.relu), grad=False, rtol=0.0, atol=0.0),
        Sample([g, x], build, relu_backward, rtol=0.0, atol=0.0, name="double_backward"),
    ]


def _sigmoid_grad(ctx):
    return [create_op(SIGMOID_GRAD, [ctx.grad_output(0), ctx.output(0)])[0]]


def _relu_inplace_kernel(x):
    return x.relu_()


def _relu_out(x, out):
    """torch.relu with ``out=`` (ATen's relu is ``clamp_min(x, 0)``, eager's ``relu_`` is
    ``clamp_min_(x, 0)``): the same bits, written into a dead temporary (sim/inplace.py)."""
    return torch.clamp_min(x, 0, out=out)


RELU = unary_op("Relu", float_spec, torch.relu, _relu_grad, lambda x: relu(x), seed=300)
declare(RELU, out_kernel=_relu_out)
RELU_INPLACE = register(
    OpDef(
        "ReluInplace",
        float_spec,
        _relu_inplace_kernel,
        grad=_relu_grad,
        inplace=(0,),
        out_name="relu_out",
        samples=unary_samples(lambda x: relu_(x * 1.0), torch.relu, seed=302),
    )
)
SIGMOID = unary_op(
    "Sigmoid",
    float_spec,
    torch.sigmoid,
    _sigmoid_grad,
    lambda x: sigmoid(x),
    -4.0,
    4.0,
    304,
    cost=_flops(4),
    pointwise=True,
)


def relu(t: Tensor) -> Tensor:
    """max(t, 0) elementwise."""
    return create_op(RELU, [t])[0]


def relu_(t: Tensor) -> Tensor:
    """t <- max(t, 0) in place; returns the updated alias of t."""
    return create_op(RELU_INPLACE, [t])[0]


def sigmoid(t: Tensor) -> Tensor:
    """1 / (1 + exp(-t)) elementwise."""
    return create_op(SIGMOID, [t])[0]


# gelu, geluerf, swish: forward ops, in-place forms and one fused gradient op each ----------


def _gelu_tanh(x):
    return F.gelu(x, approximate="tanh")


def _gelu_erf(x):
    return F.gelu(x)


def _grad_op_infer(ins, **attrs):
    same_dtype(*ins)
    if ins[0].shape != ins[1].shape:
        raise ValueError(f"gradient {ins[0].shape} and input {ins[1].shape} shapes differ")
    return [ins[1]]


def _grad_reference(fwd: Callable) -> Callable:
    """Torch autograd's vector-Jacobian product of ``fwd`` at x, for the grad op samples."""

    def vjp(g, x):
        with torch.enable_grad():
            x = x.detach().requires_grad_()
            return torch.autograd.grad(fwd(x), x, g)[0]

    return vjp


def _grad_samples(build: Callable, fwd: Callable, seed: int) -> Callable:
    return lambda: [
        Sample(
            [rand(3, 4, seed=seed), rand(3, 4, low=-3.0, high=3.0, seed=seed + 1)],
            build,
            _grad_reference(fwd),
            grad=False,
        )
    ]


def _activation(name: str, public: str, fwd: Callable, backward: Callable, flops: int, seed: int):
    """Register ``name``, ``name + 'Inplace'`` and ``name + 'Grad'``; returns the three defs.

    ``public`` is the op function's name; samples call it and its ``public + '_'`` form.
    """
    grad_def = register(
        OpDef(
            f"{name}Grad",
            floating(_grad_op_infer, (0, 1)),
            backward,
            cost=_flops(2 * flops),
            pointwise=True,
            samples=_grad_samples(lambda g, x: create_op(grad_def, [g, x])[0], fwd, seed),
        )
    )
    declare(grad_def, replica_fold=fold_elementwise())

    def grad(ctx):
        return [create_op(grad_def, [ctx.grad_output(0), ctx.input(0)])[0]]

    forward = _forward_defs(name, public, fwd, grad, flops, seed)
    return (*forward, grad_def)


def _forward_defs(name: str, public: str, fwd: Callable, grad: Callable, flops: int, seed: int):
    """The activation's op and its in-place form, sharing ``grad``."""

    def inplace_kernel(x):
        return x.copy_(fwd(x))

    lo, hi = -3.0, 3.0
    common: dict[str, Any] = dict(grad=grad, cost=_flops(flops), pointwise=True)
    fwd_def = register(
        OpDef(
            name,
            float_spec,
            fwd,
            samples=unary_samples(lambda x: globals()[public](x), fwd, lo, hi, seed + 2),
            **common,
        )
    )
    samples = unary_samples(lambda x: globals()[public + "_"](x * 1.0), fwd, lo, hi, seed + 4)
    inplace_def = register(
        OpDef(
            f"{name}Inplace",
            float_spec,
            inplace_kernel,
            inplace=(0,),
            out_name=f"{name.lower()}_out",
            samples=samples,
            **common,
        )
    )
    declare(fwd_def, replica_fold=fold_elementwise())
    declare(inplace_def, replica_fold=fold_elementwise())
    return fwd_def, inplace_def


GELU, GELU_INPLACE, GELU_GRAD = _activation(
    "Gelu",
    "gelu",
    _gelu_tanh,
    lambda g, x: torch.ops.aten.gelu_backward(g, x, approximate="tanh"),
    8,
    310,
)
GELU_ERF, GELU_ERF_INPLACE, GELU_ERF_GRAD = _activation(
    "GeluErf", "geluerf", _gelu_erf, lambda g, x: torch.ops.aten.gelu_backward(g, x), 10, 320
)
SWISH, SWISH_INPLACE, SWISH_GRAD = _activation(
    "Swish", "swish", F.silu, torch.ops.aten.silu_backward, 5, 330
)


HARD_SWISH, HARD_SWISH_INPLACE, HARD_SWISH_GRAD = _activation(
    "HardSwish", "hardswish", F.hardswish, torch.ops.aten.hardswish_backward, 5, 340
)
HARD_SIGMOID, HARD_SIGMOID_INPLACE, HARD_SIGMOID_GRAD = _activation(
    "HardSigmoid", "hardsigmoid", F.hardsigmoid, torch.ops.aten.hardsigmoid_backward, 4, 350
)


def _sigmoid_grad_samples():
    """SigmoidGrad reads the forward output; checked against autograd of torch.sigmoid."""

    def build(g, x):
        return create_op(SIGMOID_GRAD, [g, sigmoid(x)])[0]

    inputs = [rand(3, 4, seed=360), rand(3, 4, low=-4.0, high=4.0, seed=361)]
    # 2 ulps: under the default Ir.numerics="ipu" all 12 elements take torch's SIMD formula
    # (`_positional`), eager's reference takes its scalar one for the last 12 mod 32
    return [
        Sample(inputs, build, _grad_reference(torch.sigmoid), grad=False, rtol=2.5e-7, atol=0.0)
    ]


RELU_GRAD = register(
    OpDef(
        "ReluGrad",
        floating(_grad_op_infer, (0, 1)),
        _relu_grad_kernel,
        grad=_relu_grad_grad,
        samples=_relu_grad_samples,
    )
)
declare(RELU_GRAD, out_kernel=_relu_grad_out)
SIGMOID_GRAD = register(
    OpDef(
        "SigmoidGrad",
        floating(_grad_op_infer, (0, 1)),
        torch.ops.aten.sigmoid_backward,
        pointwise=True,
        cost=_flops(3),
        samples=_sigmoid_grad_samples,
    )
)


def gelu(t: Tensor) -> Tensor:
    """GELU, tanh approximation: 0.5 t (1 + tanh(sqrt(2/pi) (t + 0.044715 t^3)))."""
    return create_op(GELU, [t])[0]


def gelu_(t: Tensor) -> Tensor:
    """In-place gelu; returns the updated alias of t."""
    return create_op(GELU_INPLACE, [t])[0]


def geluerf(t: Tensor) -> Tensor:
    """Exact GELU: 0.5 t (1 + erf(t / sqrt(2)))."""
    return create_op(GELU_ERF, [t])[0]


def geluerf_(t: Tensor) -> Tensor:
    """In-place geluerf; returns the updated alias of t."""
    return create_op(GELU_ERF_INPLACE, [t])[0]


def swish(t: Tensor) -> Tensor:
    """t * sigmoid(t) elementwise."""
    return create_op(SWISH, [t])[0]


def swish_(t: Tensor) -> Tensor:
    """In-place swish; returns the updated alias of t."""
    return create_op(SWISH_INPLACE, [t])[0]


def hardswish(t: Tensor) -> Tensor:
    """t * relu6(t + 3) / 6 elementwise (torch's hardswish)."""
    return create_op(HARD_SWISH, [t])[0]


def hardswish_(t: Tensor) -> Tensor:
    """In-place hardswish; returns the updated alias of t."""
    return create_op(HARD_SWISH_INPLACE, [t])[0]


def hardsigmoid(t: Tensor) -> Tensor:
    """relu6(t + 3) / 6 elementwise (torch's hardsigmoid)."""
    return create_op(HARD_SIGMOID, [t])[0]


def hardsigmoid_(t: Tensor) -> Tensor:
    """In-place hardsigmoid; returns the updated alias of t."""
    return create_op(HARD_SIGMOID_INPLACE, [t])[0]
