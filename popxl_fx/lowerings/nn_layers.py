"""EmbeddingBag, Bilinear and RReLU, as functions and as leaf modules.

EmbeddingBag and Bilinear are one ``Aten`` op each running eager's own function (its kernel,
forward and backward: ``_embedding_bag`` and ``_trilinear``), so they equal eager bit for bit
in every mode and dtype. RReLU is leaky ReLU with the mean slope in eval; in training each
non-positive element is scaled by its own uniform draw in ``[lower, upper]``, drawn by eager's
kernel from torch's generator (``Options(rng="torch")``) or from the simulator's seeded stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

import popxl_core as popxl
from popxl_core import ops

from ..lowering import LoweringContext, lowers
from ._common import const
from ._sub import torch_rng
from .eager_layout import lower_call

__all__ = ["RReluNoise"]


def _no_max_norm(what: str, max_norm: Any) -> None:
    # eager renormalises the weight rows it reads in place: the variable would go stale
    if max_norm is not None:
        raise NotImplementedError(
            f"{what}: max_norm renormalises the weight in place, which the program does not "
            "write back; renormalise the weight outside the model instead."
        )


@lowers(F.embedding_bag)
def _embedding_bag(ctx: LoweringContext, *args: Any, **kwargs: Any) -> Any:
    _no_max_norm("embedding_bag", kwargs.get("max_norm", args[3] if len(args) > 3 else None))
    return lower_call(ops.aten_op, ctx, args, kwargs, fn=F.embedding_bag)


_BAG_OPTIONS = ("max_norm", "norm_type", "scale_grad_by_freq", "mode", "sparse")


@lowers(nn.EmbeddingBag)
def _embedding_bag_module(ctx: LoweringContext, module: nn.EmbeddingBag, *args, **kwargs):
    _no_max_norm(f"{ctx.module_path}: EmbeddingBag", module.max_norm)
    options = {name: getattr(module, name) for name in _BAG_OPTIONS}
    options.update(include_last_offset=module.include_last_offset)
    options.update(padding_idx=module.padding_idx, weight=ctx.param("weight"))
    # the call's own arguments first: `lower_call` reads the dtypes torch saw from the node's
    return lower_call(ops.aten_op, ctx, args, {**kwargs, **options}, fn=_module_bag)


def _module_bag(input, offsets=None, per_sample_weights=None, *, weight, **options):
    """``nn.EmbeddingBag.forward`` as a function of its weight."""
    return F.embedding_bag(input, weight, offsets, per_sample_weights=per_sample_weights, **options)


@lowers(F.bilinear, torch.bilinear)
def _bilinear(ctx: LoweringContext, *args: Any, **kwargs: Any) -> Any:
    return lower_call(ops.aten_op, ctx, args, kwargs, fn=F.bilinear)


@lowers(nn.Bilinear)
def _bilinear_module(ctx: LoweringContext, module: nn.Bilinear, x1, x2) -> Any:
    bias = ctx.param("bias") if module.bias is not None else None
    return lower_call(ops.aten_op, ctx, (x1, x2, ctx.param("weight"), bias), {}, fn=F.bilinear)


# RReLU ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RReluNoise:
    """Eager CPU rrelu's training noise for ``x``: 1 where ``x > 0``, else a uniform draw in
    ``[lower, upper]`` (drawn element by element in order, from torch's generator)."""

    lower: float
    upper: float

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        noise = torch.empty_like(x)
        torch.ops.aten.rrelu_with_noise(x, noise, self.lower, self.upper, True)
        return noise


def rrelu(ctx: LoweringContext, x: popxl.Tensor, lower: float, upper: float, training: bool):
    """``F.rrelu``: ``x * noise`` in training (eager's backward is ``grad * noise`` too), else
    leaky ReLU with slope ``(lower + upper) / 2``."""
    lower, upper = float(lower), float(upper)
    if not training:
        slope = (lower + upper) / 2
        return ops.where(ops.greater(x, const(0.0, x.dtype)), x, x * slope)
    if torch_rng(ctx):
        noise = ops.torch_random(RReluNoise(lower, upper), [x], (ops.Slot(0),))[0]
    else:
        draws = ops.random_uniform(ctx.seed(), tuple(x.shape), lower, upper, x.dtype)
        noise = ops.where(ops.greater(x, const(0.0, x.dtype)), const(1.0, x.dtype), draws)
    return x * noise


@lowers(F.rrelu)
def _rrelu(ctx, x, lower=1.0 / 8, upper=1.0 / 3, training=False, inplace=False):
    return rrelu(ctx, x, lower, upper, training)


@lowers(nn.RReLU)
def _rrelu_module(ctx: LoweringContext, module: nn.RReLU, x) -> Any:
    return rrelu(ctx, x, module.lower, module.upper, ctx.training)
