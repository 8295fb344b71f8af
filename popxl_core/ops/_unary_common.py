"""What the unary ops share (unary.py, activations.py, clip.py, cast.py, increment_mod.py): the
shape rules, the two-sample set and the zero gradient of piecewise-constant ops.
"""

from __future__ import annotations

from collections.abc import Callable

from ._dtype_rules import floating
from ._utils import rand
from .registry import OpDef, Sample, register

__all__ = ["float_spec", "same_spec", "unary_op", "unary_samples"]


def same_spec(ins, **attrs):
    return [ins[0]]


float_spec = floating(same_spec)  # exp, log, sqrt, trigonometry, rounding: float only in PopXL


def unary_samples(
    build: Callable, ref: Callable, low: float = -1.0, high: float = 1.0, seed: int = 0
) -> Callable:
    """Two samples (a matrix and a rank-3 tensor) with data in [low, high)."""
    return lambda: [
        Sample([rand(3, 4, low=low, high=high, seed=seed)], build, ref),
        Sample([rand(2, 3, 5, low=low, high=high, seed=seed + 1)], build, ref, name="rank3"),
    ]


def unary_op(type_name, infer, kernel, grad, build, low=-1.0, high=1.0, seed=0, **fields) -> OpDef:
    """Register the unary op ``type_name`` whose table samples run ``build`` against ``kernel``
    on data in [low, high) (`unary_samples`); ``fields`` are its other `OpDef` fields."""
    samples = unary_samples(build, kernel, low, high, seed)
    return register(OpDef(type_name, infer, kernel, grad=grad, samples=samples, **fields))
