"""Clip (clamp): elementwise bounds, with the gradient passed where the input is inside them."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from ..tensor import Tensor
from ._utils import rand
from .registry import OpDef, Sample, create_op, register

__all__ = ["clamp", "clip"]


# clip ----------------------------------------------------------------------------------------


def _clip_infer(ins, min: float, max: float):
    if min > max:
        raise ValueError(f"clip min ({min}) is greater than max ({max})")
    return [ins[0]]


def _clip_kernel(x, min: float, max: float):
    lo = None if min == -math.inf else min
    hi = None if max == math.inf else max
    if lo is None and hi is None:
        return x.clone()
    return torch.clamp(x, lo, hi).to(x.dtype)


def _clip_grad(ctx):
    from .logical import equal
    from .select import where

    # The gradient passes exactly where clipping left the value unchanged (bounds included).
    x = ctx.input(0)
    return [where(equal(x, ctx.output(0)), ctx.grad_output(0), 0.0)]


clamp: Callable[..., Tensor]  # `clip` (below), which the samples read when run


CLIP = register(
    OpDef(
        "Clip",
        _clip_infer,
        _clip_kernel,
        grad=_clip_grad,
        samples=lambda: [
            Sample(
                [rand(3, 4, low=-2.0, high=2.0, seed=230)],
                lambda x: clip(x, -0.5, 0.8),
                lambda x: torch.clamp(x, -0.5, 0.8),
            ),
            Sample(
                [rand(2, 6, low=-2.0, high=2.0, seed=231)],
                lambda x: clamp(x, min=0.1),
                lambda x: torch.clamp(x, min=0.1),
                name="min_only",
            ),
            Sample(
                [np.array([-7, 3, 12, 5], np.int32)],
                lambda x: clip(x, 0, 6),
                lambda x: torch.clamp(x, 0, 6),
                name="int",
            ),
        ],
    )
)


def clip(t: Tensor, min: float = float("-inf"), max: float = float("inf")) -> Tensor:
    """Clamp t into [min, max] elementwise."""
    return create_op(CLIP, [t], {"min": float(min), "max": float(max)})[0]


clamp = clip
