"""Dtype rules shared by the op rows: the one place that says which inputs must be floating point.

PopXL's transcendental and normalising ops (exp, log, sqrt, sigmoid, gelu, softmax, norms,
pooling, convolution, ...) only exist for float16/float32 on the IPU. torch would happily run
some of them on integers and truncate the result, so the shape rule must refuse first.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from ..errors import OpDataError
from ..tensor import TensorSpec

__all__ = ["check_float", "checked_float_to_int", "floating", "float_only_inputs"]


def check_float(s: TensorSpec, what: str = "input") -> None:
    """TypeError unless ``s`` is floating point; the op factory adds the tensor's name."""
    if not s.dtype.is_floating_point:
        raise TypeError(
            f"{what} must be floating point (float16 or float32), got {s.dtype.name}; "
            "convert it first, e.g. ops.cast(t, popxl.float32)"
        )


def floating(infer: Callable, inputs: Sequence[int] = (0,)) -> Callable:
    """Wrap a shape rule so that the inputs at positions ``inputs`` must be floating point."""

    def rule(ins, **attrs):
        for i in inputs:
            if i < len(ins):
                check_float(ins[i], f"input {i}" if len(ins) > 1 else "input")
        return infer(ins, **attrs)

    rule.float_only_inputs = tuple(inputs)  # type: ignore[attr-defined]  # a function attribute
    rule.__name__ = getattr(infer, "__name__", "rule")
    return rule


def float_only_inputs(infer: Callable) -> tuple:
    """The input positions a shape rule requires to be floating point (tests read this)."""
    return getattr(infer, "float_only_inputs", ())


def checked_float_to_int(x: torch.Tensor, data_type) -> torch.Tensor:
    """Refuse a float -> int cast of NaN, inf or a value outside the integer range.

    C (and so torch on a CPU) leaves these conversions undefined, and the answer differs
    between machines; a simulator that must not give a silent wrong number refuses them, at
    run time, naming the value. Casts between integer types wrap (two's complement), like
    integer arithmetic on the IPU.
    """
    if not (x.is_floating_point() and data_type.is_int) or x.numel() == 0:
        return x
    info = torch.iinfo(data_type.as_torch())
    # float32 rounds iinfo.max up (2**31 - 1 -> 2**31), so compare in float64
    wide = x.double()
    bad = ~torch.isfinite(wide) | (wide < info.min) | (wide >= info.max + 1)
    if bool(bad.any()):
        where = tuple(int(i) for i in bad.nonzero()[0])
        raise OpDataError(
            f"cast to {data_type.name}: value {float(wide[where])} at index {where} is not "
            f"finite or outside the {data_type.name} range [{info.min}, {info.max}]"
        )
    return x
