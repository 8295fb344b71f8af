"""Casts and copies: ``.float()`` and the other dtype methods, ``.to``, ``.type_as``, clone,
detach, the device and layout no-ops, and ``torch._assert`` (a shape check folds to a bool).
"""

from __future__ import annotations

from typing import Callable

import torch

from popxl_core import ops

from ..lowering import lowers
from ._common import is_t, pdtype

__all__: list = []


def _to_dtype(t, dt: torch.dtype):
    target = pdtype(dt)
    return t if t.dtype == target else ops.cast(t, target)


def _cast_method(dt: torch.dtype) -> Callable:
    def lower(ctx, t, *args, **kwargs):
        return _to_dtype(t, dt)

    return lower


for _name, _dt in {
    "float": torch.float32,
    "half": torch.float16,
    "double": torch.float64,
    "long": torch.int64,
    "int": torch.int32,
    "bool": torch.bool,
    "bfloat16": torch.bfloat16,
}.items():
    lowers(_name)(_cast_method(_dt))


@lowers("to", "type")
def _to(ctx, t, *args, **kwargs):
    """``.to(dtype)``, ``.to(device)``, ``.to(other)``: only the dtype matters here."""
    dt = kwargs.get("dtype")
    for a in args:
        if isinstance(a, torch.dtype):
            dt = a
        elif is_t(a):
            return t if t.dtype == a.dtype else ops.cast(t, a.dtype)
    return t if dt is None else _to_dtype(t, dt)


@lowers("type_as")
def _type_as(ctx, t, other):
    return t if t.dtype == other.dtype else ops.cast(t, other.dtype)


@lowers("contiguous", "cpu", "cuda", "requires_grad_")
def _same(ctx, t, *args, **kwargs):
    return t


@lowers(torch.clone, "clone")
def _clone(ctx, t, **kwargs):
    return ops.identity(t)


@lowers(torch.detach, "detach")
def _detach(ctx, t):
    return ops.detach(t)


@lowers(torch._assert)
def _assert(ctx, cond, message=""):
    # Shape checks fold to python bools; a tensor condition cannot stop a static graph.
    if isinstance(cond, bool) and not cond:
        raise AssertionError(f"torch._assert failed while lowering: {message}")
    return None
