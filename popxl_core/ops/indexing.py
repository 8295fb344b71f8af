"""``Tensor.__getitem__`` and the gather/scatter family (re-exported for ``popxl.ops``).

`getitem` follows popxl:
- ints, slices, ``...`` and ``None`` (numpy basic indexing) become one ``Slice`` (steps of
  +-1), a ``Subsample`` for larger steps, and one ``Reshape`` that drops the int axes and
  inserts the ``None`` axes;
- an integer Tensor or host array gathers along axis 0 (``ops.gather``); negative host
  indices are wrapped when the graph is built, run-time indices must be in range;
- a bool Tensor or host array zeroes the unselected elements (``ops.where(key, t, 0)``);
  unlike numpy, the shape is kept (the IPU needs static shapes).
"""

from __future__ import annotations

import builtins
from typing import Any, List, Tuple

import numpy as np
import torch

from ..tensor import Tensor, constant
from .gather import gather, tied_gather
from .onehot import onehot
from .scatter import scatter
from .scatter_reduce import scatter_reduce

# getitem is used by Tensor.__getitem__ and is not a popxl.ops name.
__all__ = ["gather", "onehot", "scatter", "scatter_reduce", "tied_gather"]

_BASIC = (int, np.integer, builtins.slice, type(Ellipsis), type(None))


def getitem(t: Tensor, key: Any) -> Tensor:
    """``t[key]`` with popxl's semantics (see the module docstring)."""
    if isinstance(key, Tensor):
        return _tensor_index(t, key)
    if isinstance(key, (np.ndarray, list, torch.Tensor)):
        return _host_index(t, np.asarray(key))
    items = key if isinstance(key, tuple) else (key,)
    for k in items:
        if not isinstance(k, _BASIC) or isinstance(k, (bool, np.bool_)):
            raise TypeError(
                f"{t.id!r}[{key!r}]: index {k!r} is not supported; a tuple may hold "
                "ints, slices, ... and None. For integer-array indexing use a single "
                "array or ops.gather."
            )
    return _basic_index(t, _expand_ellipsis(t, items))


def _tensor_index(t: Tensor, key: Tensor) -> Tensor:
    if key.dtype.name == "bool":
        from . import where

        return where(key, t, constant(0, t.dtype))
    if key.dtype.is_int:
        return gather(t, key)
    raise TypeError(
        f"{t.id!r}[{key.id!r}]: index tensors must be integer or bool, got {key.dtype.name}."
    )


def _host_index(t: Tensor, key: np.ndarray) -> Tensor:
    if key.dtype == np.bool_:
        return _tensor_index(t, constant(key))
    if not np.issubdtype(key.dtype, np.integer):
        raise TypeError(f"{t.id!r}[...]: index arrays must be integer or bool, got {key.dtype}.")
    if not t.shape:
        raise IndexError(f"{t.id!r} is a scalar and cannot be indexed with an array.")
    n = t.shape[0]
    if key.size and (key.min() < -n or key.max() >= n):
        raise IndexError(
            f"{t.id!r}[{key.tolist()}]: indices out of range for axis 0 of size "
            f"{n} (shape {t.shape})."
        )
    return gather(t, constant((key % max(n, 1)).astype(np.int32)))


def _expand_ellipsis(t: Tensor, items: tuple) -> list:
    consumed = sum(1 for k in items if k is not None and k is not Ellipsis)
    if consumed > t.rank:
        raise IndexError(
            f"{t.id!r}: too many indices ({consumed}) for a tensor of rank {t.rank} "
            f"(shape {t.shape})."
        )
    fill = [builtins.slice(None)] * (t.rank - consumed)
    if sum(1 for k in items if k is Ellipsis) > 1:
        raise IndexError(f"{t.id!r}: an index can only have a single ellipsis ('...').")
    if not any(k is Ellipsis for k in items):
        return list(items) + fill
    i = next(i for i, k in enumerate(items) if k is Ellipsis)
    return list(items[:i]) + fill + list(items[i + 1 :])


def _basic_index(t: Tensor, items: list) -> Tensor:
    from . import reshape, slice, subsample

    axes: List[int] = []
    starts: List[Any] = []
    stops: List[Any] = []
    steps: List[int] = []
    strides = [1] * t.rank
    # per output position: ("keep", axis), ("drop", axis) or ("new", None)
    plan: List[Tuple[str, Any]] = []
    ax = 0
    for k in items:
        if k is None:
            plan.append(("new", None))
            continue
        if isinstance(k, builtins.slice):
            step = 1 if k.step is None else int(k.step)
            if step == 0:
                raise ValueError(f"{t.id!r}: slice step cannot be zero.")
            if (k.start, k.stop, step) != (None, None, 1):
                _add_range(axes, starts, stops, steps, ax, k.start, k.stop, 1 if step > 0 else -1)
                strides[ax] = abs(step)
            plan.append(("keep", ax))
        else:
            i = _checked_int(t, int(k), ax)
            _add_range(axes, starts, stops, steps, ax, i, i + 1, 1)
            plan.append(("drop", ax))
        ax += 1
    out = slice(t, starts, stops, steps, axes) if axes else t
    if any(s > 1 for s in strides):
        out = subsample(out, strides)
    if any(kind != "keep" for kind, _ in plan):
        shape = [1 if kind == "new" else out.shape[a] for kind, a in plan if kind != "drop"]
        out = reshape(out, shape)
    return out


def _add_range(axes, starts, stops, steps, axis, start, stop, step) -> None:
    axes.append(axis)
    starts.append(start)
    stops.append(stop)
    steps.append(step)


def _checked_int(t: Tensor, i: int, axis: int) -> int:
    n = t.shape[axis]
    if not -n <= i < n:
        raise IndexError(
            f"{t.id!r}: index {i} is out of range for axis {axis} with size {n} (shape {t.shape})."
        )
    return i % n
