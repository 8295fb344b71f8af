"""A first handful of lowerings: linear, reshapes, getattr (getitem moved to shape.py).

Family files (activations, linear, shape, ...) may take these entries over: move an entry,
do not register a target twice.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import popxl_core as popxl
from popxl_core import ops

from ..lowering import LoweringContext, lowers

__all__: list = []


@lowers(nn.Linear)
def _linear_module(ctx: LoweringContext, module: nn.Linear, x: popxl.Tensor) -> popxl.Tensor:
    bias = ctx.param("bias") if module.bias is not None else None
    return _linear(ctx, x, ctx.param("weight"), bias)


@lowers(F.linear)
def _linear(
    ctx: LoweringContext, x: popxl.Tensor, weight: popxl.Tensor, bias: popxl.Tensor | None = None
) -> popxl.Tensor:
    y = x @ ops.transpose(weight)  # torch keeps weight as (out, in)
    return y + bias if bias is not None else y


@lowers("view", "reshape", torch.reshape)
def _reshape(ctx: LoweringContext, x: popxl.Tensor, *shape: Any) -> popxl.Tensor:
    # -1 is resolved from shape propagation, which ran the same call in torch.
    return ops.reshape(x, tuple(ctx.expected().shape))


@lowers(torch.flatten, "flatten")
def _flatten(
    ctx: LoweringContext, x: popxl.Tensor, start_dim: int = 0, end_dim: int = -1
) -> popxl.Tensor:
    return ops.reshape(x, tuple(ctx.expected().shape))


@lowers(nn.Flatten)
def _flatten_module(ctx: LoweringContext, module: nn.Flatten, x: popxl.Tensor) -> popxl.Tensor:
    return ops.reshape(x, tuple(ctx.expected().shape))


@lowers(getattr)
def _getattr(ctx: LoweringContext, obj: Any, name: str) -> Any:
    if isinstance(obj, popxl.Tensor) and name in ("T", "mT"):
        perm = (
            list(range(obj.rank))[::-1]
            if name == "T"
            else [*range(obj.rank - 2), obj.rank - 1, obj.rank - 2]
        )
        return ops.transpose(obj, perm)
    if isinstance(obj, popxl.Tensor):
        raise NotImplementedError(
            f"Tensor.{name} (fx node '{ctx.node.name}') has no "
            "lowering; supported attributes: T, mT."
        )
    return getattr(obj, name)
