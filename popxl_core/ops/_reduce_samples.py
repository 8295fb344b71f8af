"""Test samples of the reductions (kept apart from reduce.py to keep it small).

References are torch's own reductions (with autograd); reducing nothing (an empty axis list)
is checked against torch reducing a new size-1 axis.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from ._utils import normalize_axes, rand
from .registry import Sample

__all__ = ["expand_samples", "reduction_samples"]


def reduction_samples(name: str, fn: Callable, low: float, seed: int) -> list[Sample]:
    return [*_samples_for(name, fn, low, seed)(), *_extra_samples(name, fn, low)]


def expand_samples() -> list[Sample]:
    from .reduce import expand_reduced

    def ref(g):
        return g.reshape(3, 1, 5).expand(3, 4, 5) * 0.25

    return [
        Sample(
            [rand(3, 5, seed=40)], lambda g: expand_reduced(g, (3, 4, 5), (1,), False, 0.25), ref
        ),
        Sample(
            [rand(1, 4, 1, seed=41)],
            lambda g: expand_reduced(g, (2, 4, 3), (0, 2), True),
            lambda g: g.expand(2, 4, 3) * 1.0,
            name="keepdims",
        ),
    ]


def _samples_for(name: str, fn: Callable, low: float = -1.0, seed: int = 0) -> Callable:
    """Axis variants: one axis, negative axis with keepdims, several axes, all axes."""
    variants = [
        (1, False, "axis1"),
        (-1, True, "neg_keepdims"),
        ((0, 2), False, "two_axes"),
        (None, False, "all"),
        (None, True, "all_keepdims"),
    ]

    def samples():
        out = []
        for k, (axis, keep, label) in enumerate(variants):
            x = rand(3, 4, 5, low=low, high=low + 2.0, seed=seed + k)
            out.append(
                Sample(
                    [x],
                    lambda t, axis=axis, keep=keep: fn(t, axis, keep),
                    _reference(name, axis, keep),
                    name=label,
                    rtol=1e-4,
                    atol=1e-5,
                )
            )
        return out

    return samples


def _reference(name: str, axis, keepdims: bool) -> Callable:
    def ref(x):
        # torch's own reductions, with autograd, as the independent reference.
        axes = normalize_axes(axis, x.dim())
        return _TORCH_REFS[name](x, axes, keepdims)

    return ref


def _to_last(x, axes):
    rest = [i for i in range(x.dim()) if i not in axes]
    x = x.permute(*rest, *axes)
    return x.reshape(*x.shape[: len(rest)], -1)


def _keep_shape(shape, axes):
    return tuple(1 if i in axes else s for i, s in enumerate(shape))


def _torch_median(x, axes, keepdims):
    y = torch.median(_to_last(x, axes), dim=-1).values
    return y.reshape(_keep_shape(x.shape, axes)) if keepdims else y


def _torch_prod(x, axes, keepdims):
    y = torch.prod(_to_last(x, axes), dim=-1)
    return y.reshape(_keep_shape(x.shape, axes)) if keepdims else y


_TORCH_REFS = {
    "ReduceSum": lambda x, a, k: torch.sum(x, dim=a, keepdim=k),
    "ReduceMean": lambda x, a, k: torch.mean(x, dim=a, keepdim=k),
    "ReduceMax": lambda x, a, k: torch.amax(x, dim=a, keepdim=k),
    "ReduceMin": lambda x, a, k: torch.amin(x, dim=a, keepdim=k),
    "ReduceProd": _torch_prod,
    "ReduceMedian": _torch_median,
    "ReduceSumSquare": lambda x, a, k: torch.sum(x**2, dim=a, keepdim=k),
    "ReduceLogSum": lambda x, a, k: torch.log(torch.sum(x, dim=a, keepdim=k)),
    "ReduceLogSumExp": lambda x, a, k: torch.logsumexp(x, dim=a, keepdim=k),
    "ReduceL1": lambda x, a, k: torch.sum(torch.abs(x), dim=a, keepdim=k),
    "ReduceL2": lambda x, a, k: torch.linalg.vector_norm(x, dim=a, keepdim=k),
}


def _extra_samples(name: str, fn: Callable, low: float) -> Sequence[Sample]:
    """Integer inputs and reducing nothing (an empty axis list) where the op allows them."""
    # Reducing nothing = reducing a new size-1 axis in torch.
    out = [
        Sample(
            [rand(2, 3, low=low, high=low + 2.0, seed=90)],
            lambda t: fn(t, [], False),
            lambda x: _TORCH_REFS[name](x.unsqueeze(-1), (x.dim(),), False),
            name="no_axes",
            rtol=1e-4,
            atol=1e-5,
        )
    ]
    if name in ("ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1"):
        xi = np.random.default_rng(91).integers(-3, 4, size=(3, 4)).astype(np.int32)
        out.append(
            Sample(
                [xi],
                lambda t: fn(t, 0, False),
                lambda x: _TORCH_REFS[name](x, (0,), False).to(torch.int32),
                grad=False,
                name="int32",
            )
        )
    return out
