"""Random ATen ops, for the decomposition fallback (dropout, stochastic depth, ``torch.rand*``
and ``bernoulli`` inside a function or module the table lacks).

They draw from the simulator's seeded stream (`popxl_fx.Module.seed`: one seed variable that
advances every run, split per op), not from torch's generator: the values differ from eager
torch's, their distribution does not. Exact comparisons use p=0 or eval mode. The random ATen
ops not lowered here (`RANDOM_ATEN`) are reported as such by the fallback.

``aten.empty*`` is lowered as zeros: torch leaves its values undefined, and the
decompositions only use it as the shape of a following ``bernoulli``/``uniform``/``normal``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

import popxl_core as popxl
from popxl_core import ops

from ..lowering import LoweringContext, lowers

__all__ = ["RANDOM_ATEN"]

aten = torch.ops.aten

# Every ATen packet that reads torch's RNG. Those without an entry below raise in `check`.
RANDOM_ATEN = frozenset(
    {
        aten.rand,
        aten.rand_like,
        aten.randn,
        aten.randn_like,
        aten.bernoulli,
        aten.uniform,
        aten.normal_functional,
        aten.normal,
        aten.native_dropout,
        aten.randint,
        aten.randint_like,
        aten.randperm,
        aten.multinomial,
        aten.exponential,
        aten.geometric,
        aten.cauchy,
        aten.log_normal,
        aten.poisson,
        aten.random,
        aten.rrelu_with_noise,
        aten.rrelu_with_noise_functional,
    }
)


def _dtype(ctx: LoweringContext, dtype: torch.dtype | None, like: Any = None) -> popxl.dtype:
    if dtype is None:
        return like.dtype if like is not None else popxl.dtype.as_dtype(torch.get_default_dtype())
    dt = popxl.dtype.as_dtype(dtype)
    if dt not in (popxl.float32, popxl.float16):
        raise NotImplementedError(
            f"{ctx.node.target} with dtype {dtype} (fx node '{ctx.node.name}'): the "
            "simulator's random stream draws float16/float32 values only."
        )
    return dt


def _no_generator(ctx: LoweringContext, kwargs: dict) -> None:
    if kwargs.get("generator") is not None:
        raise NotImplementedError(
            f"{ctx.node.target} with an explicit torch.Generator (fx node "
            f"'{ctx.node.name}'): the simulator draws from its own seeded stream."
        )


def _uniform(ctx, shape: Sequence[int], dtype, low: float = 0.0, high: float = 1.0) -> Any:
    return ops.random_uniform(ctx.seed(), tuple(int(s) for s in shape), low, high, dtype)


def _normal(ctx, shape: Sequence[int], dtype, mean: float = 0.0, std: float = 1.0) -> Any:
    return ops.random_normal(ctx.seed(), tuple(int(s) for s in shape), mean, std, dtype)


@lowers(aten.rand)
def _rand(ctx: LoweringContext, size: Sequence[int], **kwargs: Any) -> Any:
    _no_generator(ctx, kwargs)
    return _uniform(ctx, size, _dtype(ctx, kwargs.get("dtype")))


@lowers(aten.randn)
def _randn(ctx: LoweringContext, size: Sequence[int], **kwargs: Any) -> Any:
    _no_generator(ctx, kwargs)
    return _normal(ctx, size, _dtype(ctx, kwargs.get("dtype")))


@lowers(aten.rand_like)
def _rand_like(ctx: LoweringContext, x: popxl.Tensor, **kwargs: Any) -> Any:
    return _uniform(ctx, x.shape, _dtype(ctx, kwargs.get("dtype"), x))


@lowers(aten.randn_like)
def _randn_like(ctx: LoweringContext, x: popxl.Tensor, **kwargs: Any) -> Any:
    return _normal(ctx, x.shape, _dtype(ctx, kwargs.get("dtype"), x))


@lowers(aten.uniform)
def _uniform_op(ctx: LoweringContext, x: popxl.Tensor, low=0.0, high=1.0, **kwargs: Any) -> Any:
    _no_generator(ctx, kwargs)
    return _uniform(ctx, x.shape, _dtype(ctx, None, x), float(low), float(high))


@lowers(aten.normal_functional)
def _normal_op(ctx: LoweringContext, x: popxl.Tensor, mean=0.0, std=1.0, **kwargs: Any) -> Any:
    _no_generator(ctx, kwargs)
    return _normal(ctx, x.shape, _dtype(ctx, None, x), float(mean), float(std))


@lowers(aten.bernoulli)
def _bernoulli(ctx: LoweringContext, x: popxl.Tensor, p: Any = None, **kwargs: Any) -> Any:
    """bernoulli.p (x's shape, probability p) and bernoulli.default (x is the probability):
    1 where a uniform draw is below the probability, like torch's."""
    _no_generator(ctx, kwargs)
    if isinstance(p, popxl.Tensor):
        raise NotImplementedError(
            f"aten.bernoulli with a tensor p (fx node '{ctx.node.name}') has no lowering."
        )
    dtype = _dtype(ctx, None, x)
    prob = x if p is None else popxl.constant(np.asarray(p, dtype=dtype.as_numpy()), dtype)
    return ops.cast(ops.less(_uniform(ctx, x.shape, dtype), prob), x.dtype)


@lowers(aten.empty, aten.empty_permuted, aten.empty_like, aten.empty_strided)
def _empty(ctx: LoweringContext, size: Any, *rest: Any, **kwargs: Any) -> Any:
    like = size if isinstance(size, popxl.Tensor) else None
    shape = like.shape if like is not None else tuple(int(s) for s in size)
    dtype = kwargs.get("dtype")
    if dtype is not None:
        dt = popxl.dtype.as_dtype(dtype)
    else:
        dt = like.dtype if like is not None else popxl.dtype.as_dtype(torch.get_default_dtype())
    return popxl.constant(np.zeros(shape, dtype=dt.as_numpy()), dt)
