"""Random ATen ops, for the decomposition fallback (dropout, stochastic depth, ``torch.rand*``
and ``bernoulli`` inside a function or module the table lacks).

With ``Options(rng="torch")`` (the default) every one of them is torch's own kernel drawing
from torch's default generator in program order (`TorchRandom`), as eager draws. With
``rng="ipu"`` they draw from the simulator's seeded stream (`popxl_fx.Module.seed`: one seed
variable that advances every run, split per op): the values differ from eager torch's, their
distribution does not; the random ATen ops not lowered for that stream (`RANDOM_ATEN`) are
reported as such by the fallback.

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
from ._sub import torch_rng
from .aten_kernels import lower_with_torch_random

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


def _either(seeded: Any) -> Any:
    """torch's kernel and generator under rng="torch", else ``seeded`` (the IPU stream)."""

    def lower(ctx: LoweringContext, *args: Any, **kwargs: Any) -> Any:
        if torch_rng(ctx):
            return lower_with_torch_random(ctx, *args, **kwargs)
        return seeded(ctx, *args, **kwargs)

    lower.__name__ = lower.__qualname__ = getattr(seeded, "__name__", "random")
    return lower


def _seeded_only(ctx: LoweringContext, *args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError(
        f"{ctx.node.target} (fx node '{ctx.node.name}') draws with torch's generator only: "
        "the simulator's seeded stream (Options(rng='ipu')) does not implement it; use the "
        "default Options(rng='torch')."
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


def _rand(ctx: LoweringContext, size: Sequence[int], **kwargs: Any) -> Any:
    _no_generator(ctx, kwargs)
    return _uniform(ctx, size, _dtype(ctx, kwargs.get("dtype")))


def _randn(ctx: LoweringContext, size: Sequence[int], **kwargs: Any) -> Any:
    _no_generator(ctx, kwargs)
    return _normal(ctx, size, _dtype(ctx, kwargs.get("dtype")))


def _rand_like(ctx: LoweringContext, x: popxl.Tensor, **kwargs: Any) -> Any:
    return _uniform(ctx, x.shape, _dtype(ctx, kwargs.get("dtype"), x))


def _randn_like(ctx: LoweringContext, x: popxl.Tensor, **kwargs: Any) -> Any:
    return _normal(ctx, x.shape, _dtype(ctx, kwargs.get("dtype"), x))


def _uniform_op(ctx: LoweringContext, x: popxl.Tensor, low=0.0, high=1.0, **kwargs: Any) -> Any:
    _no_generator(ctx, kwargs)
    return _uniform(ctx, x.shape, _dtype(ctx, None, x), float(low), float(high))


def _normal_op(ctx: LoweringContext, x: popxl.Tensor, mean=0.0, std=1.0, **kwargs: Any) -> Any:
    _no_generator(ctx, kwargs)
    return _normal(ctx, x.shape, _dtype(ctx, None, x), float(mean), float(std))


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


for _packet, _fn in (
    (aten.rand, _rand),
    (aten.randn, _randn),
    (aten.rand_like, _rand_like),
    (aten.randn_like, _randn_like),
    (aten.uniform, _uniform_op),
    (aten.normal_functional, _normal_op),
    (aten.bernoulli, _bernoulli),
):
    lowers(_packet)(_either(_fn))
for _packet in (
    aten.normal,
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
):
    lowers(_packet)(_either(_seeded_only))


@lowers(aten.native_dropout)
def _native_dropout(ctx: LoweringContext, x: popxl.Tensor, p: float, train: Any) -> Any:
    """``(x * mask * 1/(1-p), mask)`` as CPU eager computes it, the mask drawn by torch's own
    kernel (rng="torch") or the seeded stream (rng="ipu"); the gradient is through the
    products (mask * scale), as eager's native_dropout_backward."""
    if not train or p == 0:
        return x, popxl.constant(np.ones(x.shape, dtype=np.bool_), popxl.bool)
    if torch_rng(ctx):
        mask = ops.torch_random(aten.native_dropout.default, [x], (ops.Slot(0), float(p), True))[1]
    else:
        draws = _uniform(ctx, x.shape, _dtype(ctx, None, x))
        ratio = popxl.constant(np.asarray(p, dtype=draws.dtype.as_numpy()), draws.dtype)
        mask = ops.logical_not(ops.less(draws, ratio))  # kept where the draw is >= p
    scale = 0.0 if p == 1 else 1.0 / (1.0 - p)
    return ops.mul(ops.mul(x, ops.cast(mask, x.dtype)), scale), mask
