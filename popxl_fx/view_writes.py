"""In-place updates of views, written back into the tensors they view.

Eager torch's ``x[0:2].mul_(0)`` or ``y = x.view(-1); y[3] = 1`` changes ``x``: the view shares
its memory. A PopXL program has no shared memory, so when the lowering driver rebinds an
updated node to its new value (`popxl_fx.lowering`), it also builds each base's new value from
the view's: the reverse of a reshape, a transpose or a permute, or, for a basic index, the base
with the view's elements replaced (`written_chain` says how far up this goes; `check` reports
the aliases it cannot reach). The outermost tensor updated is then written back where it came
from: a buffer's variable, or a model input (`popxl_fx.module_outputs`).
"""

from __future__ import annotations

import builtins
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch.fx as fx
from torch import nn

import popxl_core as popxl
from popxl_core import ops
from popxl_core.ops.slicing import slice_grad

from .inplace import is_view, updates_in_place, written_chain

__all__ = ["warn_unwritten", "write_through"]


def write_through(
    target: fx.Node, value: Any, env: dict, relower: Callable[[fx.Node], Any]
) -> tuple[fx.Node, Any]:
    """Bind ``value`` as ``target``'s new tensor in ``env``, write it into the bases
    ``target`` is a view of, and take again the views of them lowered before (``relower``
    lowers a node from ``env``); returns the outermost tensor updated and its new value."""
    chain = written_chain(target)
    env[chain[0]] = value
    for view, base in zip(chain, chain[1:]):
        value = env[base] = _unview(view, env[base], value, env)
    _refresh(chain, env, relower)
    return chain[-1], value


def _aliases_of(node: fx.Node, env: dict, skip: set) -> list[fx.Node]:
    """The views of ``node`` (and in-place results, its tensor) already lowered."""
    return [
        u for u in node.users if u in env and u not in skip and (is_view(u) or updates_in_place(u))
    ]


def _refresh(chain: list[fx.Node], env: dict, relower: Callable[[fx.Node], Any]) -> None:
    """Views taken before the update read the updated memory in eager: take them again."""
    done = set(chain)
    todo = [u for n in chain for u in _aliases_of(n, env, done)]
    while todo:
        view = todo.pop(0)
        if view in done:
            continue
        done.add(view)
        env[view] = env[view.args[0]] if updates_in_place(view) else relower(view)
        todo += _aliases_of(view, env, done)


def _name(view: fx.Node) -> str:
    return view.target if isinstance(view.target, str) else view.target.__name__


def _unview(view: fx.Node, base: Any, value: Any, env: dict) -> Any:
    """``base`` with the elements ``view`` shows replaced by ``value``."""
    args = fx.node.map_arg(view.args[1:], env.__getitem__)
    kwargs = fx.node.map_arg(view.kwargs, env.__getitem__)
    name = _name(view)
    if not isinstance(base, popxl.Tensor):  # a tuple's element (split): nothing to write
        return base
    if updates_in_place(view):  # ``y = x.add_(1)``: y is x's tensor
        return value
    if name in _INDEXED:
        return _write_index(base, _INDEXED[name](base, *args, **kwargs), value)
    if name in _PERMUTED:
        return ops.transpose(value, _inverse(_PERMUTED[name](base, *args, **kwargs)))
    if name == "detach":
        return value
    return ops.reshape(value, tuple(base.shape))  # view, reshape, flatten, squeeze, ...


def _narrow(base, dim, start, length):
    return (builtins.slice(None),) * (dim % base.rank) + (builtins.slice(start, start + length),)


def _select(base, dim, index):
    return (builtins.slice(None),) * (dim % base.rank) + (index,)


_INDEXED: dict[str, Callable[..., Any]] = {
    "getitem": lambda base, index: index,
    "narrow": _narrow,
    "select": _select,
}


def _swap(base, d0, d1):
    perm = list(range(base.rank))
    d0, d1 = d0 % base.rank, d1 % base.rank
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return perm


def _permute(base, *dims, **kwargs):
    dims = kwargs.get("dims", dims)
    dims = dims[0] if len(dims) == 1 and isinstance(dims[0], (list, tuple)) else dims
    return [d % base.rank for d in dims]


def _t(base):
    return list(range(base.rank))[::-1]


_PERMUTED: dict[str, Callable[..., Any]] = {
    "transpose": _swap,
    "swapaxes": _swap,
    "swapdims": _swap,
    "permute": _permute,
    "t": _t,
}


def _inverse(perm: list[int]) -> list[int]:
    inverse = [0] * len(perm)
    for i, p in enumerate(perm):
        inverse[p] = i
    return inverse


def _expand(items: tuple, rank: int) -> list:
    """The items of a basic index with the Ellipsis spelled out as full slices."""
    consumed = sum(1 for i in items if i is not None and i is not Ellipsis)
    fill = [builtins.slice(None)] * (rank - consumed)
    if Ellipsis not in items:
        return list(items) + fill
    at = items.index(Ellipsis)
    return list(items[:at]) + fill + list(items[at + 1 :])


def _ranges(shape: tuple, index: Any) -> list[builtins.slice]:
    """Per axis of ``shape``, the elements a basic index picks (an int as a one-long slice)."""
    items = index if isinstance(index, tuple) else (index,)
    ranges: list[builtins.slice] = []
    for item in _expand(items, len(shape)):
        if item is None:
            continue  # a new axis of length one in the view
        size = shape[len(ranges)]
        if isinstance(item, builtins.slice):
            ranges.append(builtins.slice(*item.indices(size)))
        else:
            i = int(item) % size
            ranges.append(builtins.slice(i, i + 1, 1))
    return ranges


def _write_index(base: popxl.Tensor, index: Any, value: Any) -> popxl.Tensor:
    """``base`` with ``base[index]`` (a basic index) replaced by ``value``."""
    shape = tuple(base.shape)
    ranges = _ranges(shape, index)
    kept = tuple(len(range(r.start, r.stop, r.step)) for r in ranges)
    value = ops.reshape(value, kept)  # the ints' axes back, the new axes gone
    axes = list(range(len(shape)))
    starts, stops, steps = ([getattr(r, k) for r in ranges] for k in ("start", "stop", "step"))
    placed = slice_grad(value, shape, axes, starts, stops, steps)
    mask = np.zeros(shape, dtype=bool)
    mask[tuple(ranges)] = True
    return ops.where(popxl.constant(mask, popxl.bool), placed, base)


def warn_unwritten(model: nn.Module, positions: list[int]) -> None:
    """Say that a program other than `inference_model`'s leaves updated inputs as they were."""
    warnings.warn(
        f"{type(model).__name__}.forward updates its input(s) {positions} in place; eager "
        "torch changes the caller's tensors, this program does not (only inference_model "
        "writes them back). Update a copy (x = x.clone()) to keep eager's behaviour here.",
        stacklevel=4,
    )
