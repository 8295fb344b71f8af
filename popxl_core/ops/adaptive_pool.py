"""AdaptiveAveragePool and its gradient op (NC + 1 to 3 spatial dims), an extension for the
torch frontend: output bin ``i`` of a dim of size n pooled to m averages the inputs
[floor(i n / m), ceil((i + 1) n / m)), so bins may overlap (m > n repeats inputs).

The kernels are torch's (``adaptive_avg_pool{1,2,3}d`` forward, and autograd of it backward,
which is the kernel eager PyTorch's backward runs), so the numbers are eager's bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from ..tensor import Tensor
from . import _spatial as sp
from ._dtype_rules import check_float
from ._utils import rand, spec
from .registry import Cost, OpDef, Sample, create_op, register

__all__ = ["adaptive_average_pool"]

_POOL = {1: F.adaptive_avg_pool1d, 2: F.adaptive_avg_pool2d, 3: F.adaptive_avg_pool3d}


def _infer(ins, output_size):
    x = ins[0]
    r = sp.check_rank(x.shape, "adaptive_average_pool")
    check_float(x, "the pooling input")
    if len(output_size) != r or any(m < 1 for m in output_size):
        raise ValueError(
            f"output_size {tuple(output_size)} must hold {r} positive sizes for the "
            f"input {tuple(x.shape)}"
        )
    return [spec((*x.shape[:2], *output_size), x.dtype)]


def _kernel(x, output_size):
    return _POOL[len(output_size)](x, list(output_size))


def _grad_infer(ins, output_size, input_shape):
    return [spec(input_shape, ins[0].dtype)]


# the backward kernels autograd runs for adaptive_avg_pool{2,3}d (1-D pools as 2-D, height 1)
_BACKWARD = {
    2: torch.ops.aten._adaptive_avg_pool2d_backward,
    3: torch.ops.aten._adaptive_avg_pool3d_backward,
}


def _traced_grad(dy, input_shape):
    """Under torch.compile (``kernels="inductor"``): the backward op itself, which autograd
    would call; ``torch.autograd.grad`` would break the step's graph (and restart it)."""
    if len(input_shape) == 3:
        n, c, width = input_shape
        return _traced_grad(dy.unsqueeze(-2), (n, c, 1, width)).squeeze(-2)
    return _BACKWARD[len(input_shape) - 2](dy, dy.new_empty(input_shape))


def _grad_kernel(dy, output_size, input_shape):
    if torch.compiler.is_compiling():
        return _traced_grad(dy, input_shape)
    # only the input's shape matters to the backward kernel
    x = dy.new_zeros(input_shape).requires_grad_()
    with torch.enable_grad():
        return torch.autograd.grad(_kernel(x, output_size), x, dy)[0]


def _grad(ctx):
    attrs = {**ctx.attrs, "input_shape": tuple(ctx.op.inputs[0].shape)}
    return [create_op(ADAPTIVE_AVERAGE_POOL_GRAD, [ctx.grad_output(0)], attrs)[0]]


def _cost(ins, outs, attrs) -> Cost:
    big = max(ins[0].nelms, outs[0].nelms)
    return Cost(big, sum(s.nbytes for s in ins) + sum(s.nbytes for s in outs))


def _samples():
    def case(shape, out, seed, name):
        return Sample(
            [rand(*shape, seed=seed)],
            lambda x: adaptive_average_pool(x, out),
            lambda x: _POOL[len(out)](x, out),
            rtol=0.0,
            atol=0.0,
            name=name,
        )

    return [
        case((2, 3, 2, 2), (7, 7), 370, "upsample_2d"),
        case((2, 3, 9, 7), (4, 3), 371, "overlapping_2d"),
        case((2, 3, 10), (4,), 372, "1d"),
        case((1, 2, 5, 4, 3), (2, 3, 2), 373, "3d"),
    ]


def _grad_samples():
    def build(dy, x):
        return create_op(
            ADAPTIVE_AVERAGE_POOL_GRAD, [dy], {"output_size": (7, 5), "input_shape": tuple(x.shape)}
        )[0]

    def ref(dy, x):
        x = x.detach().requires_grad_()
        with torch.enable_grad():
            return torch.autograd.grad(F.adaptive_avg_pool2d(x, (7, 5)), x, dy)[0]

    return [
        Sample(
            [rand(2, 3, 7, 5, seed=374), rand(2, 3, 3, 8, seed=375)],
            build,
            ref,
            grad=False,
            rtol=0.0,
            atol=0.0,
        )
    ]


ADAPTIVE_AVERAGE_POOL = register(
    OpDef(
        "AdaptiveAveragePool",
        _infer,
        _kernel,
        grad=_grad,
        cost=_cost,
        samples=_samples,
        out_name="adaptive_average_pool_out",
    )
)
ADAPTIVE_AVERAGE_POOL_GRAD = register(
    OpDef(
        "AdaptiveAveragePoolGrad",
        _grad_infer,
        _grad_kernel,
        cost=_cost,
        samples=_grad_samples,
        out_name="adaptive_average_pool_grad_out",
    )
)


def adaptive_average_pool(t: Tensor, output_size: Sequence[int]) -> Tensor:
    """Average-pool the spatial dims of ``t`` (N, C, *spatial) to ``output_size`` with torch's
    adaptive bins."""
    return create_op(
        ADAPTIVE_AVERAGE_POOL, [t], {"output_size": tuple(int(m) for m in output_size)}
    )[0]
