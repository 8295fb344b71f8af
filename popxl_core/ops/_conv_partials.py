"""The partials type of a convolution and its gradient ops: what a float16 conv accumulates in.

Poplar's convolutions (poplin) keep their intermediate sums, the partials, in float32 unless
a program asks for half (PopART's ``convolutionOptions`` ``{"partialsType": "half"}``, popxl's
``conv(..., partials_types=["half"])``, PopTorch's ``Precision.setPartialsType(torch.half)``).
A conv whose partials type is ``"float"`` here computes its float16 inputs in float32 and
rounds its result to float16 once, under every `Ir.numerics`. ``"half"`` does the same: the
simulator does not round partial sums to float16 (torch's CPU float16 conv kernels sum in
float32 too, tests/test_conv_partials.py), so half partials are a memory setting here, not a
numerics one.

Without a partials type (neither the op nor the session option names one) a float16 conv
runs as before: under ``Ir.numerics == "torch"`` torch's own float16 kernel, bit for bit
eager PyTorch's ``model.half()``, which popxl_fx promises by default; under ``"ipu"`` the
op table's `OpDef.fp16_in_fp32` already computes it in float32. Why a float path at all:
torch's CPU float16 weight and bias gradients of a convolution take a slow generic kernel (a
12x5x63x63 input's weight gradient: 0.97 s in float16, 14 ms in float32), which made
PopTorch's mixed-precision tutorial 20x slower than in float32. The float32 results rounded
once match torch's float16 kernels bit for bit except where float32 sums in another order land
on the other side of a float16 rounding boundary (dx: 413 of 238,140 elements differ by one
ulp on that input).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = ["PARTIALS_OPTION", "partials_attr", "stated", "with_partials"]

# the kernel keyword that receives the session's ``convolutionOptions["partialsType"]``, read
# when a Session compiles (`OpDef.session_options`)
PARTIALS_OPTION = {"session_partials": "conv_partials_type"}

_NAMES = {"float": "float", "half": "half", "float32": "float", "float16": "half"}


def partials_attr(partials_types: str | Sequence[str] | None) -> str | None:
    """popxl's ``partials_types`` argument (one name, or one per conv: all the same here) as
    the op attribute ``partials_type``: ``"float"``, ``"half"`` or None (the session's)."""
    if partials_types is None:
        return None
    names = [partials_types] if isinstance(partials_types, str) else list(partials_types)
    kinds = {_NAMES.get(str(n).lower()) for n in names}
    if None in kinds or len(kinds) != 1:
        raise ValueError(
            f"conv: partials_types must be 'float' or 'half' (one for the conv), got "
            f"{partials_types!r}."
        )
    return kinds.pop()


def stated(partials_type: str | None, session_partials: str) -> bool:
    """Whether the conv has a partials type: its own, else the session's."""
    return _NAMES.get(str(partials_type or session_partials).lower()) is not None


def with_partials(kernel: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``kernel`` taking the ``partials_type`` attribute and the session's partials type:
    float16 arguments computed in float32 and the result rounded to float16 once where a
    partials type is given; otherwise ``kernel`` itself."""

    @functools.wraps(kernel)
    def run(*args: Any, partials_type=None, session_partials="", **attrs: Any) -> torch.Tensor:
        half = [isinstance(a, torch.Tensor) and a.dtype == torch.float16 for a in args]
        if not any(half) or not stated(partials_type, session_partials):
            return kernel(*args, **attrs)
        wide = [a.float() if h else a for a, h in zip(args, half)]
        return kernel(*wide, **attrs).to(torch.float16)

    return run
