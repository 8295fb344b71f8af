"""Lowering a standard module from inside another one's lowering (e.g. the attention of a
TransformerEncoderLayer): a context for the child and the child's own table entry."""

from __future__ import annotations

import copy
from typing import Any

import torch.nn as nn

__all__ = ["call_child", "child_ctx", "dropout", "torch_rng"]


def child_ctx(ctx: Any, name: str, module: nn.Module) -> Any:
    """``ctx`` for the child module ``name``: parameters resolve under ``<path>.<name>``."""
    sub = copy.copy(ctx)
    sub.module_path = f"{ctx.module_path}.{name}" if ctx.module_path else name
    sub.training = module.training
    return sub


def call_child(ctx: Any, parent: nn.Module, name: str, *args: Any, **kwargs: Any) -> Any:
    """Lower ``parent.<name>(*args)`` with the child's table entry."""
    from ..lowering import lookup

    module = getattr(parent, name)
    fn = lookup(type(module))
    if fn is None:
        path = child_ctx(ctx, name, module).module_path
        raise NotImplementedError(f"{type(module).__name__} ({path}) has no lowering")
    return fn(child_ctx(ctx, name, module), module, *args, **kwargs)


def dropout(ctx: Any, x: Any, p: float, training: bool) -> Any:
    """torch's dropout: identity unless training with p > 0. With ``Options(rng="torch")``
    the noise is eager's, drawn from torch's generator (the same mask after the same
    ``torch.manual_seed``); with ``rng="ipu"`` the simulator's seeded stream draws it."""
    from popxl_core import ops

    if not training or p == 0:
        return x
    if p >= 1:
        return x * 0.0
    if torch_rng(ctx):
        return ops.mul(x, ops.torch_random(ops.DropoutNoise(float(p)), [x])[0])
    return ops.dropout(x, ctx.seed(), float(p))


def torch_rng(ctx: Any) -> bool:
    """Whether random ops draw from torch's generator (`Options.rng`, default "torch")."""
    return getattr(ctx.owner, "rng", "torch") == "torch"
