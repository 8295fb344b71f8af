"""scaled_add / scaled_add_: a*X + b*Y, the workhorse of optimiser updates.

A python float ``a`` or ``b`` is an attribute of the op; a Tensor ``a`` or ``b`` is an extra
op input (inputs are X, Y, then a, then b), as in PopXL, so ``scaled_add_(w, g, b=-lr)``
has two inputs and ``scaled_add_(w, g, b=lr_tensor)`` three. X and Y may have different
float dtypes (float32 weights updated with float16 gradients); the result has X's dtype.
"""

from __future__ import annotations

from typing import Dict, Optional

import numpy as np
import torch

from ..sim.speed import declare
from ..tensor import Tensor
from ._utils import as_tensor, broadcast_shapes, rand, spec, unbroadcast
from .forms import Foreach, columns, shared_identity
from .registry import Cost, OpDef, Sample, create_op, register

__all__ = ["scaled_add", "scaled_add_"]

Scale = float | Tensor


def _check_numeric(x, y, scales) -> None:
    if x.dtype.is_floating_point != y.dtype.is_floating_point:
        raise TypeError(
            f"X ({x.dtype.name}) and Y ({y.dtype.name}) must both be floating point or both integer"
        )
    for s in scales:
        if s.nelms != 1:
            raise ValueError(f"a tensor scale must have one element, got shape {s.shape}")


def _infer(ins, a: float | None = None, b: float | None = None):
    x, y, *scales = ins
    if len(scales) != (a is None) + (b is None):
        raise ValueError("expected one extra input per tensor scale")
    _check_numeric(x, y, scales)
    return [spec(broadcast_shapes(x.shape, y.shape), x.dtype)]


def _inplace_infer(ins, a: float | None = None, b: float | None = None):
    out = _infer(ins, a, b)[0]
    if out.shape != ins[0].shape:
        raise ValueError(
            f"the in-place target X {ins[0].shape} cannot be broadcast to "
            f"{out.shape}: Y {ins[1].shape} must broadcast to X's shape"
        )
    return [ins[0]]


def _scales(scales, a, b):
    it = iter(scales)
    return (next(it) if a is None else a), (next(it) if b is None else b)


def _number(s):
    """A one-element scale tensor read as a number, so that a scale fed per step (a learning
    rate from a stream) rounds exactly like an attribute: torch's ``add(alpha=)`` fuses the
    multiply-add, which is what optimisers written in torch (``p.add_(g, alpha=-lr)``) do.
    Traced by torch.compile (``kernels="inductor"``, not bitwise) the tensor stays: ``.item()``
    would break the step's graph in two, or make the rate a constant compiled in."""
    if isinstance(s, torch.Tensor) and s.numel() == 1 and not torch.compiler.is_compiling():
        return s.item()
    return s


def _whole(x: torch.Tensor, s):
    """An integral scale of an integer tensor as an int: torch's ``alpha`` must be one for
    integer tensors, and a whole float scales them exactly (PopXL's default scales are 1.0)."""
    if not x.is_floating_point() and isinstance(s, float) and s.is_integer():
        return int(s)
    return s


def _kernel(x, y, *scales, a=None, b=None):
    sa, sb = (_whole(x, _number(s)) for s in _scales(scales, a, b))
    xs = x if isinstance(sa, (int, float)) and sa == 1 else x * sa
    if isinstance(sb, (int, float)) and y.dtype == x.dtype:
        return torch.add(xs, y, alpha=sb)
    return (xs + y * sb).to(x.dtype)


def _inplace_kernel(x, y, *scales, a=None, b=None):
    sa, sb = (_whole(x, _number(s)) for s in _scales(scales, a, b))
    if not (isinstance(sa, (int, float)) and sa == 1):
        x.mul_(sa)
    if isinstance(sb, (int, float)):
        return x.add_(y.to(x.dtype), alpha=sb)
    return x.add_((y * sb).to(x.dtype))


def _cost(ins, outs, attrs) -> Cost:
    nbytes = sum(s.nbytes for s in ins) + sum(s.nbytes for s in outs)
    return Cost(3 * outs[0].nelms, nbytes)


def _like(t: Tensor, ref: Tensor) -> Tensor:
    from .unary import cast

    return t if t.dtype is ref.dtype else cast(t, ref.dtype)


def _times(g: Tensor, scale) -> Tensor:
    from .elementwise import mul

    if isinstance(scale, Tensor):
        return mul(g, _like(scale, g))
    return g if scale == 1 else mul(g, scale)


def _grad(ctx):
    from .elementwise import mul

    g = ctx.grad_output(0)
    a, b = ctx.attrs.get("a"), ctx.attrs.get("b")
    ins = ctx.op.inputs
    idx = iter(range(2, len(ins)))
    ia = next(idx) if a is None else None
    ib = next(idx) if b is None else None
    sa = ctx.input(ia) if ia is not None else a
    sb = ctx.input(ib) if ib is not None else b
    grads = [None] * len(ins)
    if ctx.requires_grad(0):
        grads[0] = _like(unbroadcast(_times(g, sa), ins[0].shape), ins[0])
    if ctx.requires_grad(1):
        grads[1] = _like(unbroadcast(_times(g, sb), ins[1].shape), ins[1])
    for i, j in ((ia, 0), (ib, 1)):
        if i is not None and ctx.requires_grad(i):
            prod = mul(g, _like(ctx.input(j), g))
            grads[i] = _like(unbroadcast(prod, ins[i].shape), ins[i])
    return grads


def _ref(a=1.0, b=1.0):
    def run(x, y, *scales):
        sa, sb = _scales(scales, a, b)
        return (sa * x + sb * y.to(x.dtype)).to(x.dtype)

    return run


def _samples():
    def ab(x, y, sa, sb):
        return scaled_add(x, y, a=sa, b=sb)

    return [
        Sample(
            [rand(3, 4, seed=90), rand(3, 4, seed=91)],
            lambda x, y: scaled_add(x, y),
            _ref(),
            name="default",
        ),
        Sample(
            [rand(3, 4, seed=92), rand(4, seed=93)],
            lambda x, y: scaled_add(x, y, 0.5, -2.0),
            _ref(0.5, -2.0),
            name="broadcast",
        ),
        Sample(
            [rand(3, 4, seed=94), rand(3, 4, seed=95), np.float32(0.7), np.float32(-1.3)],
            ab,
            _ref(None, None),
            name="tensor_scales",
        ),
        Sample(
            [rand(3, 4, seed=96), rand(3, 4, seed=97), np.float32(-0.25)],
            lambda x, y, sb: scaled_add(x, y, 2.0, sb),
            _ref(2.0, None),
            name="tensor_b",
        ),
        Sample(
            [rand(3, 4, seed=98), rand(3, 4, seed=99).astype(np.float16)],
            lambda x, y: scaled_add(x, y, b=-0.5),
            _ref(1.0, -0.5),
            rtol=1e-3,
            atol=1e-3,
            name="mixed_dtype",
        ),
    ]


def _inplace_samples():
    return [
        # `x * 1.0` gives the in-place op a fresh target instead of the graph input.
        Sample(
            [rand(3, 4, seed=100), rand(4, seed=101)],
            lambda x, y: scaled_add_(x * 1.0, y, b=-0.05),
            _ref(1.0, -0.05),
        ),
        Sample(
            [rand(3, 4, seed=102), rand(3, 4, seed=103), np.float32(-0.1)],
            lambda x, y, sb: scaled_add_(x * 1.0, y, b=sb),
            _ref(1.0, None),
            name="tensor_b",
        ),
        Sample(
            [rand(2, 2, seed=104), rand(2, 2, seed=105).astype(np.float16), np.float32(0.3)],
            lambda x, y, sb: scaled_add_(x * 1.0, y, 0.9, sb),
            _ref(0.9, None),
            rtol=1e-3,
            atol=1e-3,
            name="mixed_dtype",
        ),
    ]


# the multi-tensor form (sim/foreach.py): the arithmetic of `_kernel` / `_inplace_kernel` over
# lists, for float32 X and Y of the output's shape and scalar scales shared by the group
def _foreach_key(op) -> tuple | None:
    x, y, *scales = op.inputs
    out = tuple(op.outputs[0].shape)
    if tuple(x.shape) != out or tuple(y.shape) != out or any(tuple(s.shape) != () for s in scales):
        return None
    return (op.attrs.get("a"), op.attrs.get("b"), *map(shared_identity, scales))


def _foreach_kernel(inplace: bool):
    def kernel(ops, key, mode):
        a, b, n = ops[0].attrs.get("a"), ops[0].attrs.get("b"), len(ops[0].inputs)

        def run(*flat):
            xs, ys, *scales = columns(flat, n)
            sa, sb = (_number(s) for s in _scales([c[0] for c in scales], a, b))
            one = isinstance(sa, (int, float)) and sa == 1
            if inplace:
                if not one:
                    torch._foreach_mul_(xs, sa)
                torch._foreach_add_(xs, ys, alpha=sb)
                return tuple(xs)
            scaled = xs if one else torch._foreach_mul(xs, sa)
            return tuple(torch._foreach_add(scaled, ys, alpha=sb))

        return run

    return kernel


SCALED_ADD = register(
    OpDef(
        "ScaledAdd",
        _infer,
        _kernel,
        grad=_grad,
        cost=_cost,
        samples=_samples,
        out_name="scaledadd_out",
    )
)
declare(SCALED_ADD, foreach=Foreach(_foreach_key, _foreach_kernel(inplace=False)))
SCALED_ADD_LHS_INPLACE = register(
    OpDef(
        "ScaledAddLhsInplace",
        _inplace_infer,
        _inplace_kernel,
        grad=_grad,
        cost=_cost,
        inplace=(0,),
        samples=_inplace_samples,
        out_name="scaledadd_out",
    )
)
declare(SCALED_ADD_LHS_INPLACE, foreach=Foreach(_foreach_key, _foreach_kernel(inplace=True)))


def _operands(X: Tensor, Y: Tensor, a: Scale, b: Scale):
    inputs = [X, as_tensor(Y, X)]
    attrs: Dict[str, Optional[float]] = {}
    for key, s in (("a", a), ("b", b)):
        if isinstance(s, Tensor):
            inputs.append(s)
            attrs[key] = None
        else:
            attrs[key] = float(s)
    return inputs, attrs


def scaled_add(X: Tensor, Y: Tensor, a: Scale = 1.0, b: Scale = 1.0) -> Tensor:
    """a*X + b*Y, broadcasting; float scales are attributes, Tensor scales extra inputs."""
    inputs, attrs = _operands(X, Y, a, b)
    return create_op(SCALED_ADD, inputs, attrs)[0]


def scaled_add_(X: Tensor, Y: Tensor, a: Scale = 1.0, b: Scale = 1.0) -> Tensor:
    """X <- a*X + b*Y in place; returns the updated alias of X."""
    inputs, attrs = _operands(X, Y, a, b)
    return create_op(SCALED_ADD_LHS_INPLACE, inputs, attrs)[0]
