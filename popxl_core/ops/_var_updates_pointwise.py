"""In-place pointwise updates with torch's own kernels: lerp_, addcmul_, addcdiv_.

torch.optim's single-tensor Adam is written with these three (``exp_avg.lerp_(g, 1-b1)``,
``exp_avg_sq.mul_(b2).addcmul_(g, g, value=1-b2)``, ``p.addcdiv_(m, denom, value=-step)``).
Each fuses its arithmetic in one kernel (lerp picks one of two formulas by the weight;
addcmul/addcdiv compute ``t + value * x * y`` / ``t + value * x / y`` in the kernel's order), so
composing them from separate ops differs in the last bit. These ops call the same kernels, which
makes a simulated optimizer step bitwise equal to torch's.

The scalar (weight or value) is a float attribute or a float32 scalar tensor input (fed per step,
so a learning-rate schedule needs no new program); torch converts it to the tensor's dtype, as
here.
"""

from __future__ import annotations

import torch

from ..sim.speed import declare
from ..tensor import Tensor
from ._utils import broadcast_shapes, rand
from ._var_updates_common import check_float, check_scalar
from .forms import Foreach, columns, shared_identity
from .registry import Cost, OpDef, Sample, create_op, elementwise_cost, register

__all__ = ["addcdiv_", "addcmul_", "lerp_"]


def _infer(n_operands: int):
    def infer(ins, scalar):
        t, operands, extra = ins[0], ins[1 : 1 + n_operands], ins[1 + n_operands :]
        check_float("t", t)
        for i, x in enumerate(operands):
            check_float(f"operand {i + 1}", x)
            if x.dtype != t.dtype:
                raise TypeError(f"operand {i + 1} is {x.dtype.name} but t is {t.dtype.name}")
            if broadcast_shapes(t.shape, x.shape) != t.shape:
                raise ValueError(f"operand {i + 1} {x.shape} must broadcast to t's {t.shape}")
        if extra:
            check_scalar("the scalar", extra[0])
        elif scalar is None:
            raise ValueError("a scalar (float or scalar tensor) is needed")
        return [t]

    return infer


def _value(extra, scalar) -> float:
    # .item() of a float32 tensor is that float32 value exactly; torch rounds it to t's dtype
    return float(extra[0].reshape(()).item()) if extra else float(scalar)


def _traced(extra) -> bool:
    """A scalar tensor traced by torch.compile (``kernels="inductor"``, not bitwise): kept a
    tensor, as ``.item()`` would break the step's graph in two (scaled_add's ``_number``)."""
    return bool(extra) and torch.compiler.is_compiling()


def _lerp_kernel(t, x, *extra, scalar):
    return t.lerp_(x, extra[0].reshape(()) if _traced(extra) else _value(extra, scalar))


# traced: torch's own decompositions of addcmul / addcdiv (torch._refs), the value a tensor
def _addcmul_kernel(t, x, y, *extra, scalar):
    if _traced(extra):
        return t.add_(extra[0].reshape(()) * x * y)
    return t.addcmul_(x, y, value=_value(extra, scalar))


def _addcdiv_kernel(t, x, y, *extra, scalar):
    if _traced(extra):
        return t.add_(extra[0].reshape(()) * (x / y))
    return t.addcdiv_(x, y, value=_value(extra, scalar))


def _cost(flops: int):
    def cost(ins, outs, attrs) -> Cost:
        base = elementwise_cost(ins, outs, attrs)
        return Cost(base.flops * flops, base.bytes)

    return cost


def _scalar_inputs(scalar: float | Tensor) -> tuple[float | None, list[Tensor]]:
    return (None, [scalar]) if isinstance(scalar, Tensor) else (float(scalar), [])


def _samples(build, ref, n_operands: int, seed: int):
    """Bitwise against torch (rtol=atol=0): the same kernel on the same values."""
    t = rand(3, 5, seed=seed)
    xs = [rand(3, 5, seed=seed + 1 + i, low=0.5, high=2.0) for i in range(n_operands)]
    w = torch.tensor(0.3, dtype=torch.float32).numpy()
    return lambda: [
        Sample(
            [t, *xs],
            lambda a, *b: build(a * 1.0, *b, 0.1),
            lambda a, *b: ref(a, *b, 0.1),
            grad=False,
            rtol=0,
            atol=0,
            name="float",
        ),
        Sample(
            [t, *xs, w],
            lambda a, *b: build(a * 1.0, *b),
            lambda a, *b: ref(a, *b[:-1], b[-1].item()),
            grad=False,
            rtol=0,
            atol=0,
            name="tensor",
        ),
        Sample(
            [t, *xs],
            lambda a, *b: build(a * 1.0, *b, 0.7),
            lambda a, *b: ref(a, *b, 0.7),
            grad=False,
            rtol=0,
            atol=0,
            name="large",
        ),
    ]


def _foreach(n: int, multi) -> Foreach:
    """The multi-tensor form (sim/foreach.py): ops of one kind sharing their scalar (the same
    scalar tensor, or an equal float attribute) run as one ``torch._foreach_lerp_`` /
    ``_foreach_addcmul_`` / ``_foreach_addcdiv_``, as ``torch.optim.Adam(foreach=True)`` does.
    Same bits: the scalar reaches the foreach kernel as the same Python float (the ``Scalar``
    overloads), and on CPU those loop over the lists calling the single-tensor ATen ops."""

    def key(op) -> tuple | None:
        target, operands, extra = op.inputs[0], op.inputs[1 : 1 + n], op.inputs[1 + n :]
        if any(tuple(x.shape) != tuple(target.shape) for x in operands):
            return None  # an operand broadcasts: the foreach kernels want one per target
        return (op.attrs.get("scalar"), *map(shared_identity, extra))

    def kernel(ops, key, mode):
        scalar, width = ops[0].attrs.get("scalar"), len(ops[0].inputs)

        def run(*flat):
            cols = columns(flat, width)
            value = _value(cols[1 + n][:1] if len(cols) > 1 + n else (), scalar)
            multi(cols[0], *cols[1 : 1 + n], value)
            return tuple(cols[0])

        return run

    return Foreach(key, kernel)


def _op(name, kernel, multi, n_operands, flops, build, ref, seed):
    opdef = register(
        OpDef(
            name,
            _infer(n_operands),
            kernel,
            cost=_cost(flops),
            inplace=(0,),
            samples=_samples(build, ref, n_operands, seed),
            out_name=f"{name.lower()}_out",
            fp16_in_fp32=False,
        )
    )
    return declare(opdef, foreach=_foreach(n_operands, multi))


LERP = _op(
    "LerpInplace",
    _lerp_kernel,
    torch._foreach_lerp_,
    1,
    3,
    lambda t, x, w: lerp_(t, x, w),
    lambda t, x, w: t.clone().lerp_(x, w),
    700,
)
ADDCMUL = _op(
    "AddcmulInplace",
    _addcmul_kernel,
    torch._foreach_addcmul_,
    2,
    3,
    lambda t, x, y, v: addcmul_(t, x, y, v),
    lambda t, x, y, v: t.clone().addcmul_(x, y, value=v),
    710,
)
ADDCDIV = _op(
    "AddcdivInplace",
    _addcdiv_kernel,
    torch._foreach_addcdiv_,
    2,
    3,
    lambda t, x, y, v: addcdiv_(t, x, y, v),
    lambda t, x, y, v: t.clone().addcdiv_(x, y, value=v),
    720,
)


def lerp_(t: Tensor, x: Tensor, weight: float | Tensor) -> Tensor:
    """In place, torch's ``t.lerp_(x, weight)``: ``t + weight * (x - t)`` (for |weight| < 0.5;
    torch's kernel uses ``x - (x - t) * (1 - weight)`` otherwise)."""
    scalar, extra = _scalar_inputs(weight)
    return create_op(LERP, [t, x, *extra], {"scalar": scalar})[0]


def addcmul_(t: Tensor, x: Tensor, y: Tensor, value: float | Tensor = 1.0) -> Tensor:
    """In place, torch's ``t.addcmul_(x, y, value=value)``: ``t + value * x * y``."""
    scalar, extra = _scalar_inputs(value)
    return create_op(ADDCMUL, [t, x, y, *extra], {"scalar": scalar})[0]


def addcdiv_(t: Tensor, x: Tensor, y: Tensor, value: float | Tensor = 1.0) -> Tensor:
    """In place, torch's ``t.addcdiv_(x, y, value=value)``: ``t + value * x / y``."""
    scalar, extra = _scalar_inputs(value)
    return create_op(ADDCDIV, [t, x, y, *extra], {"scalar": scalar})[0]
