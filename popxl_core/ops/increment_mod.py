"""IncrementMod: (t + increment) mod modulus, out of place and in place."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from ..tensor import Tensor
from ._utils import rand
from .registry import OpDef, Sample, create_op, register

__all__ = ["increment_mod", "increment_mod_"]


# increment_mod -------------------------------------------------------------------------------


def _incmod_infer(ins, increment: float, modulus: float):
    if modulus == 0:
        raise ValueError("increment_mod modulus must not be zero")
    return [ins[0]]


def _incmod_kernel(x, increment: float, modulus: float):
    return torch.fmod(x + increment, modulus).to(x.dtype)


def _incmod_inplace_kernel(x, increment: float, modulus: float):
    return x.copy_(_incmod_kernel(x, increment, modulus))


def _incmod_grad(ctx):
    return [ctx.grad_output(0)]  # the slope is 1 away from the wrap-around points


def _incmod_samples(fn: Callable, seed: int) -> Callable:
    return lambda: [
        Sample(
            [rand(3, 4, low=0.0, high=2.0, seed=seed)],
            lambda x: fn(x, 1.25, 2.5),
            lambda x: torch.fmod(x + 1.25, 2.5),
        ),
        Sample(
            [np.array([0, 3, 4, 6], np.int32)],
            lambda x: fn(x, 1, 5),
            lambda x: torch.fmod(x + 1, 5),
            name="int",
        ),
    ]


INCREMENT_MOD = register(
    OpDef(
        "IncrementMod",
        _incmod_infer,
        _incmod_kernel,
        grad=_incmod_grad,
        samples=_incmod_samples(lambda x, i, m: increment_mod(x, i, m), 260),
    )
)
INCREMENT_MOD_INPLACE = register(
    OpDef(
        "IncrementModInplace",
        _incmod_infer,
        _incmod_inplace_kernel,
        grad=_incmod_grad,
        inplace=(0,),
        out_name="incrementmod_out",
        samples=_incmod_samples(lambda x, i, m: increment_mod_(x * 1, i, m), 262),
    )
)


def increment_mod(t: Tensor, increment: float, modulus: float) -> Tensor:
    """fmod(t + increment, modulus) elementwise (a wrapping counter)."""
    return create_op(INCREMENT_MOD, [t], {"increment": increment, "modulus": modulus})[0]


def increment_mod_(t: Tensor, increment: float, modulus: float) -> Tensor:
    """t <- fmod(t + increment, modulus) in place; returns the updated alias of t."""
    return create_op(INCREMENT_MOD_INPLACE, [t], {"increment": increment, "modulus": modulus})[0]
