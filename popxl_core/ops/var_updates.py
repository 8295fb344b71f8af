"""popxl.ops.var_updates: in-place optimiser state updates (accumulators, Adam, LAMB, copies).

A float factor is bound into the op as an attribute; a Tensor factor becomes an extra op
input (this is what `print_schedule` shows).

Accumulator ops (Accumulate, SparseAccumulate, AccumulatorScale) compute in the accumulator's
dtype, as the IPU's var-update ops do: the coefficients are formed in float32 (``1 - f``,
``f / (f + 1)``), then they and the update ``X`` are cast to the accumulator's dtype and the
rule is evaluated in that dtype, each operation rounded. For float32 accumulators this is plain
float32 arithmetic; for float16 state it is what the tutorial's Adam prints after one step
(first order 0.9*0 + 0.1h*0.1h = 0.009995, not the float32-then-rounded 0.01).
"""

from __future__ import annotations

import numpy as np
import torch

from .. import dtypes
from ..sim.speed import declare
from ..tensor import Tensor, constant
from ._utils import broadcast_shapes, rand, randint
from ._var_updates_adam import adam_updater, adam_var_update, adamax_updater, lamb_updater
from ._var_updates_common import (
    Factor,
    check_float,
    check_scalar,
    f16,
    f32,
    factor_inputs,
    in_dtype_of,
)
from ._var_updates_foreach import ACCUMULATE_FOREACH
from ._var_updates_fused import fused_adam_, fused_sgd_
from ._var_updates_pointwise import addcdiv_, addcmul_, lerp_
from ._var_updates_sparse import sparse_accumulate_
from ._var_updates_state import accumulator_scale_, accumulator_zero_, copy_var_update_
from .registry import Cost, OpDef, Sample, create_op, elementwise_cost, register

__all__ = [
    "accumulate_",
    "accumulate_mean_",
    "accumulate_moving_average_",
    "accumulate_moving_average_square_",
    "accumulate_square_",
    "accumulator_scale_",
    "accumulator_zero_",
    "adam_updater",
    "adam_var_update",
    "adamax_updater",
    "addcdiv_",
    "addcmul_",
    "copy_var_update_",
    "fused_adam_",
    "fused_sgd_",
    "lamb_updater",
    "lerp_",
    "sparse_accumulate_",
]

# kind -> (t, X, f, c) -> new t. t and X are in the accumulator's dtype, f is a float32 scalar
# and c casts a float32 coefficient to the accumulator's dtype (`f` is the step, for 'mean').
_RULES = {
    "add": lambda t, x, f, c: t + c(f) * x,
    "square": lambda t, x, f, c: t + c(f) * (x * x),
    "mean": lambda t, x, f, c: c(f / (f + 1)) * t + x / c(f + 1),
    "moving_average": lambda t, x, f, c: c(f) * t + c(1 - f) * x,
    "moving_average_square": lambda t, x, f, c: c(f) * t + c(1 - f) * (x * x),
}


# Accumulate ---------------------------------------------------------------------------
def _accumulate_infer(ins, kind, factor):
    if kind not in _RULES:
        raise ValueError(f"unknown accumulation kind {kind!r}; one of {sorted(_RULES)}")
    t, x = ins[0], ins[1]
    if t.dtype.is_int:
        _check_int_accumulate(t, x, ins[2:], kind, factor)
    else:
        check_float("t", t)
        # an integer X is cast to t's dtype, as PopXL takes accumulate_(w, constant(2))
        if not (x.dtype.is_floating_point or x.dtype.is_int):
            raise TypeError(f"X must be a float or integer tensor, got {x.dtype.name}")
    if broadcast_shapes(t.shape, x.shape) != t.shape:
        raise ValueError(f"X {x.shape} must broadcast to the accumulator's shape {t.shape}")
    if len(ins) > 2:
        if not t.dtype.is_int:
            check_scalar("step" if kind == "mean" else "f", ins[2])
    elif kind == "mean" or (factor is None and kind != "add"):
        raise ValueError(f"accumulation kind {kind!r} needs a factor")
    return [t]


def _check_int_accumulate(t, x, factor_in, kind, factor) -> None:
    """popxl accumulates integer tensors too (t += f * X, exact); only with integer factors,
    so nothing is silently truncated."""
    if kind not in ("add", "square"):
        raise TypeError(
            f"accumulation kind {kind!r} needs a floating point t, got "
            f"{t.dtype.name} (integers support plain and square accumulation)"
        )
    if x.dtype != t.dtype:
        raise TypeError(f"X is {x.dtype.name} but the integer accumulator t is {t.dtype.name}")
    if factor is not None and float(factor) != int(factor):
        raise ValueError(f"the factor {factor} of an integer accumulator must be a whole number")
    if factor_in and (not factor_in[0].dtype.is_int or factor_in[0].nelms != 1):
        raise TypeError(
            f"the factor of an integer accumulator must be an integer scalar, got "
            f"{factor_in[0].dtype.name} {factor_in[0].shape}"
        )


def _accumulate_kernel(t, x, *factor_in, kind, factor):
    if not t.is_floating_point():  # exact integer arithmetic, no float32 round trip
        f = factor_in[0].reshape(()) if factor_in else torch.tensor(int(factor or 1))
        t.copy_(_RULES[kind](t, x, f, lambda v: v.to(t.dtype)))
        return t
    f = f32(factor_in[0] if factor_in else (1.0 if factor is None else factor))
    c = in_dtype_of(t)
    t.copy_(_RULES[kind](t, c(x), f, c))
    return t


def _accumulate_cost(ins, outs, attrs) -> Cost:
    base = elementwise_cost(ins, outs, attrs)
    return Cost(base.flops * 3, base.bytes)


def _acc_sample(kind, build, ref, *inputs, rtol=1e-5, name=""):
    return Sample(list(inputs), build, ref, grad=False, rtol=rtol, atol=1e-6, name=name or kind)


def _accumulate_samples():
    t, x, x2 = rand(3, 4, seed=10), rand(3, 4, seed=11), rand(4, seed=12)
    f, step = np.array(0.3, np.float32), np.array(2.0, np.float32)
    h = rand(2, 2, seed=13, dtype=np.float16)
    return [
        _acc_sample("add", lambda a, b: accumulate_(a, b), lambda a, b: a + b, t, x),
        _acc_sample(
            "add",
            lambda a, b: accumulate_(a, b, 0.5),
            lambda a, b: a + 0.5 * b,
            t,
            x,
            name="add_float_f",
        ),
        _acc_sample(
            "add",
            lambda a, b, c: accumulate_(a, b, c),
            lambda a, b, c: a + c * b,
            t,
            x2,
            f,
            name="add_tensor_f_broadcast",
        ),
        _acc_sample(
            "square",
            lambda a, b: accumulate_square_(a, b, 0.25),
            lambda a, b: a + 0.25 * b * b,
            t,
            x,
        ),
        _acc_sample(
            "mean",
            lambda a, b, s: accumulate_mean_(a, b, s),
            lambda a, b, s: s / (s + 1) * a + b / (s + 1),
            t,
            x,
            step,
        ),
        _acc_sample(
            "moving_average",
            lambda a, b: accumulate_moving_average_(a, b, 0.9),
            lambda a, b: 0.9 * a + 0.1 * b,
            t,
            x,
        ),
        _acc_sample(
            "moving_average",
            lambda a, b, c: accumulate_moving_average_(a, b, c),
            lambda a, b, c: c * a + (1 - c) * b,
            t,
            x,
            f,
            name="moving_average_tensor_f",
        ),
        _acc_sample(
            "moving_average_square",
            lambda a, b: accumulate_moving_average_square_(a, b, 0.999),
            lambda a, b: 0.999 * a + 0.001 * b * b,
            t,
            x,
        ),
        # float16 state with a float32 update: X and the float32 coefficients 0.9 and
        # 1 - 0.9 are cast to float16 and the rule runs in float16 (IPU var-update semantics)
        _acc_sample(
            "moving_average",
            lambda a, b: accumulate_moving_average_(a, b, 0.9),
            lambda a, b: f16(0.9) * a + f16(1 - np.float32(0.9)) * b.half(),
            h,
            rand(2, 2, seed=14),
            rtol=0,
            name="float16_state",
        ),
        _acc_sample(
            "square",
            lambda a, b: accumulate_square_(a, b, 0.25),
            lambda a, b: a + f16(0.25) * (b.half() * b.half()),
            h,
            rand(2, 2, seed=15),
            rtol=0,
            name="float16_state_square",
        ),
        _acc_sample(
            "add",
            lambda a, b: accumulate_(a, b),
            lambda a, b: a + b,
            randint(3, 4, high=2**30, seed=16),
            randint(3, 4, high=2**30, seed=17),
            rtol=0,
            name="int32",
        ),
        _acc_sample(
            "add",
            lambda a, b, c: accumulate_(a, b, c),
            lambda a, b, c: a + c * b,
            randint(2, 3, high=1000, seed=18),
            randint(3, high=1000, seed=19),
            np.array(-3, np.int32),
            rtol=0,
            name="int32_tensor_f",
        ),
        _acc_sample(
            "square",
            lambda a, b: accumulate_square_(a, b, 2.0),
            lambda a, b: (a.long() + 2 * b.long() ** 2).to(torch.uint32),
            randint(2, 3, high=2**31, seed=20).astype(np.uint32),
            randint(2, 3, high=2**20, seed=21).astype(np.uint32),
            rtol=0,
            name="uint32_wraps",
        ),
    ]


ACCUMULATE = register(
    OpDef(
        "Accumulate",
        _accumulate_infer,
        _accumulate_kernel,
        cost=_accumulate_cost,
        inplace=(0,),
        samples=_accumulate_samples,
        out_name="accumulate_out",
        fp16_in_fp32=False,
    )
)
declare(ACCUMULATE, foreach=ACCUMULATE_FOREACH)


def _accumulate(kind: str, t: Tensor, X: Tensor, f: Factor | None) -> Tensor:
    factor, extra = factor_inputs(f)
    return create_op(ACCUMULATE, [t, X, *extra], {"kind": kind, "factor": factor})[0]


def accumulate_(t: Tensor, X: Tensor, f: Factor | None = None) -> Tensor:
    """In place: t += f * X (t += X when f is None); returns the updated alias of t."""
    return _accumulate("add", t, X, f)


def accumulate_square_(t: Tensor, X: Tensor, f: Factor = 1.0) -> Tensor:
    """In place: t += f * X**2."""
    return _accumulate("square", t, X, f)


def accumulate_mean_(t: Tensor, X: Tensor, step: float | Tensor) -> Tensor:
    """In place running mean: t = step/(step+1) * t + X/(step+1); step is a float32 input."""
    if not isinstance(step, Tensor):
        step = constant(step, dtypes.float32)
    return create_op(ACCUMULATE, [t, X, step], {"kind": "mean", "factor": None})[0]


def accumulate_moving_average_(t: Tensor, X: Tensor, f: Factor) -> Tensor:
    """In place: t = f * t + (1 - f) * X."""
    return _accumulate("moving_average", t, X, f)


def accumulate_moving_average_square_(t: Tensor, X: Tensor, f: Factor) -> Tensor:
    """In place: t = f * t + (1 - f) * X**2."""
    return _accumulate("moving_average_square", t, X, f)
