"""``x.random_(...)``: x filled with whole numbers drawn uniformly, in x's dtype.

The ATen decomposition cannot be traced (its overload's argument is named ``from``, a Python
keyword, which make_fx's generated code cannot spell), so the method is lowered directly.
With ``Options(rng="torch")`` it is torch's own functional ``aten.random``, drawing from
torch's generator as eager does; with ``rng="ipu"`` it is the floor of a uniform draw in
``[from, to)`` from the simulator's seeded stream.
"""

from __future__ import annotations

from typing import Any

import torch

import popxl_core as popxl
from popxl_core import ops

from ..lowering import LoweringContext, lowers
from ._sub import torch_rng
from .eager_layout import lower_call

__all__: list = []

# torch's default upper bound: every whole number the dtype holds exactly, from 0
_DEFAULT_TO = {popxl.float16: 2**11 + 1, popxl.float32: 2**24 + 1, popxl.int32: 2**31 - 1}


@lowers("random_", torch.Tensor.random_)
def _random_(ctx: LoweringContext, x: popxl.Tensor, *bounds: Any, generator=None) -> Any:
    if generator is not None:
        raise NotImplementedError(
            f"random_ with an explicit torch.Generator (fx node '{ctx.node.name}'): draws come "
            "from torch's default generator (or the simulator's stream)."
        )
    if torch_rng(ctx):
        return lower_call(ops.torch_random, ctx, (x, *bounds), {}, torch.ops.aten.random)
    low, high = _bounds(x.dtype, bounds)
    draws = ops.random_uniform(ctx.seed(), tuple(x.shape), float(low), float(high), popxl.float32)
    # float32 rounding may reach ``high`` itself: it is excluded
    return ops.cast(ops.clip(ops.floor(draws), float(low), float(high - 1)), x.dtype)


def _bounds(dtype: popxl.dtype, bounds: tuple) -> tuple[int, int]:
    """``(from, to)`` of ``random_()``, ``random_(to)`` or ``random_(from, to)``."""
    if len(bounds) == 2 and bounds[1] is not None:
        return int(bounds[0]), int(bounds[1])
    if len(bounds) == 1 and bounds[0] is not None:
        return 0, int(bounds[0])
    return (int(bounds[0]) if bounds else 0), _DEFAULT_TO.get(dtype, 2**24 + 1)
