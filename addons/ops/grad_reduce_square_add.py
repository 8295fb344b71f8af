"""``grad_reduce_square_add``: the sum of squares of a (loss-scaled) gradient, unscaled
(popxl.addons' ``GradReduceSquareAdd`` custom op): ``sum(t ** 2) / loss_scaling ** 2`` in
float32, whatever ``t``'s dtype, for gradient norms."""

from __future__ import annotations

from typing import Union

import numpy as np
import torch

import popxl_core as popxl
from popxl_core import Tensor, TensorSpec, ops
from popxl_core.ops.registry import Cost, OpDef, Sample, create_op, register

__all__ = ["grad_reduce_square_add", "GRAD_REDUCE_SQUARE_ADD"]


def _infer(ins):
    t, scale = ins
    if not t.dtype.is_floating_point or scale.dtype != popxl.float32 or scale.nelms != 1:
        raise ValueError(
            f"grad_reduce_square_add takes a floating point tensor and a float32 scalar scale; "
            f"got {t.dtype.name} and {scale.dtype.name} {scale.shape}."
        )
    return [TensorSpec((), popxl.float32)]


def _kernel(t, scale):
    # the IPU reduces in float32 and scales the result (popops' SQUARE_ADD with a scale)
    return torch.sum(torch.square(t.float())) * scale.reshape(())


def _grad(ctx):
    t, scale = ctx.input(0), ctx.input(1)
    g = ctx.grad_output(0) * scale.reshape(()) * 2
    return [ops.cast(ops.cast(t, popxl.float32) * g, t.dtype), None]


def _samples():
    x = np.random.default_rng(0).uniform(-2, 2, (3, 5)).astype(np.float32)
    return [
        Sample(
            [x],
            lambda t: grad_reduce_square_add(t, loss_scaling=4),
            lambda t: torch.sum(t * t) * (1 / 16),
            rtol=1e-6,
        )
    ]


GRAD_REDUCE_SQUARE_ADD = register(
    OpDef(
        "GradReduceSquareAdd",
        lambda ins: _infer(ins),
        kernel=_kernel,
        grad=_grad,
        cost=lambda ins, outs, attrs: Cost(2 * ins[0].nelms, ins[0].nbytes + 8),
        samples=_samples,
        out_name="grad_reduced",
    )
)


def grad_reduce_square_add(t: Tensor, loss_scaling: Union[int, float, Tensor]) -> Tensor:
    """``sum(t ** 2) / loss_scaling ** 2`` as a float32 scalar (``t`` scaled by
    ``loss_scaling``): ``ops.sqrt`` of it is the unscaled gradient norm."""
    scale = 1 / (loss_scaling * loss_scaling)
    if not isinstance(scale, Tensor):
        scale = popxl.constant(scale, popxl.float32)
    return create_op(GRAD_REDUCE_SQUARE_ADD, [t, scale])[0]
