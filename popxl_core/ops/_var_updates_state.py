"""AccumulatorScale (and accumulator_zero_) and CopyVarUpdate: state set in place by a factor
or overwritten.
"""

from __future__ import annotations

import numpy as np
import torch

from ..sim.speed import declare
from ..tensor import Tensor
from ._utils import rand
from ._var_updates_common import (
    Factor,
    check_float,
    check_scalar,
    f16,
    f32,
    factor_inputs,
    in_dtype_of,
)
from ._var_updates_foreach import COPY_FOREACH, SCALE_FOREACH
from .registry import OpDef, Sample, create_op, register

__all__ = ["accumulator_scale_", "accumulator_zero_", "copy_var_update_"]


# AccumulatorScale -----------------------------------------------------------------------
def _scale_infer(ins, factor):
    check_float("t", ins[0])
    if len(ins) > 1:
        check_scalar("f", ins[1])
    elif factor is None:
        raise ValueError("accumulator_scale_ needs a factor")
    return [ins[0]]


def _scale_kernel(t, *factor_in, factor):
    if not factor_in and factor == 0.0:
        return t.zero_()  # a constant 0 resets the accumulator, even when it holds inf/nan
    t.mul_(in_dtype_of(t)(f32(factor_in[0] if factor_in else factor)))
    return t


ACCUMULATOR_SCALE = register(
    OpDef(
        "AccumulatorScale",
        _scale_infer,
        _scale_kernel,
        inplace=(0,),
        out_name="accumulatorscale_out",
        fp16_in_fp32=False,
        samples=lambda: [
            Sample(
                [rand(3, 4, seed=30)],
                lambda a: accumulator_scale_(a, 0.25),
                lambda a: 0.25 * a,
                grad=False,
                name="float_f",
            ),
            Sample(
                [rand(3, 4, seed=31), np.array(-1.5, np.float32)],
                lambda a, f: accumulator_scale_(a, f),
                lambda a, f: f * a,
                grad=False,
                name="tensor_f",
            ),
            Sample(
                [np.array([1.0, np.inf, 3.0], np.float32)],
                lambda a: accumulator_zero_(a),
                lambda a: torch.zeros(3),
                grad=False,
                name="zero",
            ),
            Sample(
                [rand(3, 4, seed=32, dtype=np.float16)],
                lambda a: accumulator_scale_(a, 0.3),
                lambda a: a * f16(0.3),
                grad=False,
                rtol=0,
                atol=0,
                name="float16_state",
            ),
        ],
    )
)
declare(ACCUMULATOR_SCALE, foreach=SCALE_FOREACH)


def accumulator_scale_(t: Tensor, f: Factor) -> Tensor:
    """In place: t = f * t; a float f of 0 zeroes t."""
    factor, extra = factor_inputs(f)
    return create_op(ACCUMULATOR_SCALE, [t, *extra], {"factor": factor})[0]


def accumulator_zero_(t: Tensor) -> Tensor:
    """In place: t = 0."""
    return accumulator_scale_(t, 0.0)


# CopyVarUpdate ----------------------------------------------------------------------------
def _copy_infer(ins):
    t, x = ins
    if t.shape != x.shape or t.dtype is not x.dtype:
        raise ValueError(
            f"X {x.shape} {x.dtype.name} must match the updated tensor {t.shape} {t.dtype.name}"
        )
    return [t]


COPY_VAR_UPDATE = register(
    OpDef(
        "CopyVarUpdate",
        _copy_infer,
        lambda t, x: t.copy_(x),
        inplace=(0,),
        fp16_in_fp32=False,
        out_name="copyvarupdate_out",
        samples=lambda: [
            Sample(
                [rand(2, 3, seed=40), rand(2, 3, seed=41)],
                lambda a, b: copy_var_update_(a, b),
                lambda a, b: b * 1,
                grad=False,
            ),
            Sample(
                [rand(4, seed=42, dtype=np.float16), rand(4, seed=43, dtype=np.float16)],
                lambda a, b: copy_var_update_(a, b),
                lambda a, b: b * 1,
                grad=False,
                name="float16",
            ),
        ],
    )
)
declare(COPY_VAR_UPDATE, foreach=COPY_FOREACH)


def copy_var_update_(t: Tensor, X: Tensor) -> Tensor:
    """In place: t = X."""
    return create_op(COPY_VAR_UPDATE, [t, X])[0]
