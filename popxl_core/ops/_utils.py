"""Helpers shared by the op families: argument coercion, shape rules, gradient utilities."""

from __future__ import annotations

from typing import Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np

from ..tensor import Tensor, TensorSpec, scalar_operand
from .registry import broadcast_shapes

__all__ = [
    "as_tensor",
    "binary_infer",
    "coerce_pair",
    "broadcast_shapes",
    "normalize_axes",
    "unbroadcast",
    "same_dtype",
    "spec",
    "rand",
    "randint",
]


def as_tensor(value, like: Tensor) -> Tensor:
    """A Tensor as is; a python/numpy value as a constant of ``like``'s dtype (current graph)."""
    if isinstance(value, Tensor):
        return value
    return scalar_operand(value, like.dtype, like)


def coerce_pair(lhs, rhs):
    """Binary-op operands as tensors; a python scalar takes the other operand's dtype."""
    if not isinstance(lhs, Tensor):
        if not isinstance(rhs, Tensor):
            raise TypeError(
                f"At least one operand must be a popxl.Tensor, got {lhs!r} and {rhs!r}."
            )
        lhs = scalar_operand(lhs, rhs.dtype, rhs)
    return lhs, as_tensor(rhs, lhs)


def spec(shape: Sequence[int], dt) -> TensorSpec:
    return TensorSpec(tuple(shape), dt)


def same_dtype(*specs: TensorSpec) -> None:
    dts = {s.dtype for s in specs}
    if len(dts) > 1:
        raise TypeError(f"inputs must have the same dtype, got {', '.join(d.name for d in dts)}")


def normalize_axes(axis: Union[None, int, Iterable[int]], rank: int) -> Tuple[int, ...]:
    """Axes as a sorted tuple of non-negative ints; None means all axes."""
    if axis is None:
        return tuple(range(rank))
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    out: List[int] = []
    for a in axes:
        if not -rank <= a < max(rank, 1):
            raise ValueError(f"axis {a} is out of range for rank {rank}")
        out.append(int(a) % max(rank, 1))
    return tuple(sorted(set(out)))


def unbroadcast(g: Tensor, shape: Sequence[int]) -> Tensor:
    """Sum ``g`` over the axes that broadcasting expanded to reach ``g.shape`` from ``shape``."""
    shape = tuple(shape)
    if g.shape == shape:
        return g
    from . import reduce_sum, reshape

    lead = len(g.shape) - len(shape)
    axes = [
        i for i in range(len(g.shape)) if i < lead or (shape[i - lead] == 1 and g.shape[i] != 1)
    ]
    summed = reduce_sum(g, axes, keepdims=True) if axes else g
    return reshape(summed, shape)


def rand(
    *shape: int, low: float = -1.0, high: float = 1.0, seed: Optional[int] = None, dtype=np.float32
) -> np.ndarray:
    """Deterministic random test data for op samples."""
    rng = np.random.default_rng(seed if seed is not None else abs(hash(shape)) % (2**32))
    return rng.uniform(low, high, size=shape).astype(dtype)


def randint(*shape: int, high: int, seed: int = 0, dtype=np.int32) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, high, size=shape).astype(dtype)


def binary_infer(ins, **attrs):
    """The shape rule of a broadcasting binary op: both dtypes equal, numpy broadcasting."""
    same_dtype(*ins)
    return [spec(broadcast_shapes(ins[0].shape, ins[1].shape), ins[0].dtype)]
