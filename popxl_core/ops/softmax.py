"""Softmax and LogSoftmax along one axis, and their gradient ops (torch's own backward
kernels on the forward output).
"""

from __future__ import annotations

import numpy as np
import torch

from ..sim.speed import declare
from ..tensor import Tensor
from ._dtype_rules import check_float
from ._utils import rand, same_dtype
from .forms import fold_axis
from .registry import Cost, OpDef, Sample, create_op, register

__all__ = ["log_softmax", "softmax"]


def _softmax_infer(ins, axis):
    check_float(ins[0])
    return [ins[0]]


def _softmax_cost(ins, outs, attrs) -> Cost:
    # max, subtract, exp, sum, divide: about five operations per element.
    return Cost(5 * ins[0].nelms, ins[0].nbytes + outs[0].nbytes)


def _softmax_grad_infer(ins, axis):
    same_dtype(*ins)
    if tuple(ins[0].shape) != tuple(ins[1].shape):
        raise ValueError(f"the gradient {ins[0].shape} and output {ins[1].shape} shapes differ")
    return [ins[1]]


# torch's own backward kernels: g y - y sum(g y), and g - exp(y) sum(g), vectorised their way
def _softmax_grad_kernel(g, y, axis):
    return torch.ops.aten._softmax_backward_data(g, y, axis, y.dtype)


def _log_softmax_grad_kernel(g, y, axis):
    return torch.ops.aten._log_softmax_backward_data(g, y, axis, y.dtype)


def _softmax_grad_samples(fwd, torch_fwd, grad_def):
    """The gradient op on the forward op's output, against torch autograd, bit for bit."""

    def build(g, x):
        return create_op(grad_def(), [g, fwd(x, 1)], {"axis": 1})[0]

    def ref(g, x):
        x = x.detach().requires_grad_()
        with torch.enable_grad():
            return torch.autograd.grad(torch_fwd(x, 1), x, g)[0]

    inputs = [rand(3, 5, 2, seed=302), rand(3, 5, 2, low=-3, high=3, seed=303)]
    return lambda: [Sample(inputs, build, ref, grad=False, rtol=0.0, atol=0.0)]


def _softmax_samples(fn, ref):
    return lambda: [
        Sample(
            [rand(4, 6, low=-3, high=3, seed=300)],
            lambda x: fn(x, -1),
            lambda x: ref(x, -1),
            name="last",
        ),
        Sample(
            [rand(2, 5, 3, low=-3, high=3, seed=301)],
            lambda x: fn(x, 1),
            lambda x: ref(x, 1),
            name="middle",
        ),
    ]


def _register_pair(name: str, out_name: str, torch_fwd, grad_kernel, build):
    """Register the op ``name`` (``torch_fwd`` along ``axis``) and its gradient op
    ``name + "Grad"`` (``grad_kernel`` on the forward output); ``build`` is the public op."""

    def grad(ctx):
        return create_op(grad_def, [ctx.grad_output(0), ctx.output(0)], dict(ctx.attrs))

    fwd_def = register(
        OpDef(
            name,
            _softmax_infer,
            lambda x, axis: torch_fwd(x, axis),
            grad=grad,
            cost=_softmax_cost,
            out_name=out_name,
            samples=_softmax_samples(build, torch_fwd),
        )
    )
    declare(fwd_def, replica_fold=fold_axis("axis"))
    grad_def: OpDef  # its samples read it, lazily
    grad_def = register(
        OpDef(
            f"{name}Grad",
            _softmax_grad_infer,
            grad_kernel,
            cost=_softmax_cost,
            samples=_softmax_grad_samples(build, torch_fwd, lambda: grad_def),
        )
    )
    declare(grad_def, replica_fold=fold_axis("axis"))
    return fwd_def, grad_def


SOFTMAX, SOFTMAX_GRAD = _register_pair(
    "Softmax", "softmax_out", torch.softmax, _softmax_grad_kernel, lambda x, a: softmax(x, a)
)
LOG_SOFTMAX, LOG_SOFTMAX_GRAD = _register_pair(
    "LogSoftmax",
    "logsoftmax_out",
    torch.log_softmax,
    _log_softmax_grad_kernel,
    lambda x, a: log_softmax(x, a),
)


def _axis(t: Tensor, axis: int, what: str) -> int:
    if not isinstance(t, Tensor):
        raise TypeError(f"{what}: expected a popxl.Tensor, got {type(t).__name__}.")
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
        raise TypeError(f"{what}: axis must be an int, got {axis!r}.")
    if not -t.rank <= axis < t.rank:
        raise ValueError(f"{what}: axis {axis} is out of range for {t.id} of shape {t.shape}.")
    return int(axis) % t.rank


def softmax(t: Tensor, axis: int) -> Tensor:
    """Softmax of ``t`` along ``axis`` (required, as in popxl)."""
    return create_op(SOFTMAX, [t], {"axis": _axis(t, axis, "softmax")})[0]


def log_softmax(t: Tensor, axis: int) -> Tensor:
    """log(softmax(t)) along ``axis``, computed stably."""
    return create_op(LOG_SOFTMAX, [t], {"axis": _axis(t, axis, "log_softmax")})[0]
