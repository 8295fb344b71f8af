"""`print_tensor`: a tensor printed when the program runs (PopTorch's ``ipu_print_tensor``).

Eager torch returns the tensor unprinted, as PopTorch's CPU kernel does; the lowering is
popxl's PrintTensor op with Poplar's layout, so every run of the program prints to stderr."""

from __future__ import annotations

import torch

from popxl_core import ops

from ..lowering import lowers

__all__ = ["print_tensor"]


def print_tensor(t: torch.Tensor, title: str, print_gradient: bool, *options) -> torch.Tensor:
    """``t``; ``options`` are PopTorch's: summarise threshold, edge items, line width, digits,
    float format, separator, open and close bracket."""
    return t


@lowers(print_tensor)
def _lower_print(ctx, t, title: str, print_gradient: bool, *options):
    # print_self: True; the gradient is printed only when asked. ``options`` are the seven
    # formatting arguments before ``layout`` (the traced function's), which the checker
    # cannot count
    out = ops.print_tensor(t, title, True, bool(print_gradient), *options, layout="poplar")  # type: ignore[misc]
    return out
