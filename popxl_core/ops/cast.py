"""Cast (dtype conversion) and Detach (a gradient stop), both forms: out of place and in place."""

from __future__ import annotations

import numpy as np
import torch

from .. import dtypes
from ..tensor import Tensor
from ._dtype_rules import checked_float_to_int
from ._unary_common import same_spec
from ._utils import rand, spec
from .registry import OpDef, Sample, create_op, no_grad, register

__all__ = ["cast", "detach", "detach_"]


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
