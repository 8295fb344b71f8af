"""`GraphCache`: reuse a traced graph when a function is traced again with matching arguments."""

from __future__ import annotations

import functools
import inspect
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from popxl_core import Graph, Ir, Tensor, TensorSpec, gir, ops
from popxl_core.context import get_current_context

from .dot_tree import DotTree
from .graph import BoundGraph, GraphWithNamedArgs

__all__ = ["GraphCache", "function"]


class _Unhashable(Exception):
    """An argument that cannot be part of a cache key: trace without caching."""


def _arg_key(x: Any) -> Any:
    """A hashable key that is equal for arguments that trace to the same graph."""
    if isinstance(x, (Tensor, TensorSpec)):
        return ("tensor", tuple(x.shape), x.dtype, tuple(x.meta_shape))
    if isinstance(x, GraphWithNamedArgs):
        return ("graph", x.graph)
    if isinstance(x, BoundGraph):
        return ("bound", x.graph, tuple((k, _arg_key(v)) for k, v in x.args.items()))
    if isinstance(x, DotTree):
        return ("tree", type(x), tuple((k, _arg_key(v)) for k, v in x.to_dict().items()))
    if isinstance(x, (list, tuple)):
        return (type(x), tuple(_arg_key(v) for v in x))
    if isinstance(x, Mapping):
        return ("map", tuple((k, _arg_key(v)) for k, v in x.items()))
    try:
        hash(x)
    except TypeError:
        raise _Unhashable(type(x).__name__) from None
    # The type is part of the key: True, 1 and 1.0 are equal but may trace differently.
    return (type(x), x)


class GraphCache:
    """Traces ``fn`` once per distinct (fn, placement, argument specs) in each Ir.

    Tensor arguments match by shape, dtype and meta shape; other arguments by value.

    >>> cache = GraphCache()  # doctest: +SKIP
    >>> g1 = cache.create_graph(fn, x)  # doctest: +SKIP
    >>> g1 is cache.create_graph(fn, x.spec)  # doctest: +SKIP
    True
    """

    def __init__(self) -> None:
        self._graphs: weakref.WeakKeyDictionary[Ir, weakref.WeakValueDictionary] = (
            weakref.WeakKeyDictionary()
        )

    def create_graph(self, fn: Callable, *args: Any, **kwargs: Any) -> Graph:
        """The cached graph for these arguments, tracing ``fn`` on a miss."""
        ir = gir()
        key = self._key(fn, args, kwargs)
        if key is None:
            return ir.create_graph(fn, *args, **kwargs)
        per_ir = self._graphs.setdefault(ir, weakref.WeakValueDictionary())
        graph = per_ir.get(key)
        if graph is None:
            graph = ir.create_graph(fn, *args, **kwargs)
            per_ir[key] = graph
        return graph

    @staticmethod
    def _key(fn: Callable, args, kwargs) -> tuple | None:
        ctx = get_current_context()
        try:
            arg_keys = tuple(_arg_key(a) for a in args)
            kw_keys = tuple(sorted((k, _arg_key(v)) for k, v in kwargs.items()))
        except _Unhashable:
            return None
        return (_fn_key(fn), ctx.ipu_id, ctx.io_tile_set, arg_keys, kw_keys)


def _fn_key(fn: Callable) -> Any:
    """``fn`` itself, or its hash when its class defines ``__hash__`` without ``__eq__``.

    popxl.addons keys its cache on hashes, so two module instances whose ``__hash__`` agree
    (say, a hash of their config) share one graph; python's default ``__eq__`` (identity)
    would keep them apart.
    """
    cls = type(fn)
    if cls.__hash__ is not object.__hash__ and cls.__eq__ is object.__eq__:
        return ("hash", cls, hash(fn))
    return fn


def tensor_inputs(fn: Callable, args, kwargs) -> list[Tensor]:
    """The Tensor arguments in the order `Ir.create_graph` turns them into graph inputs."""
    sig = inspect.signature(fn)
    bound = sig.bind(*args, **kwargs)
    out: list[Tensor] = []
    for value in bound.arguments.values():
        values = (
            value.values()
            if isinstance(value, dict)
            else (value if isinstance(value, (list, tuple)) else [value])
        )
        for v in values:
            if isinstance(v, TensorSpec):
                raise TypeError(
                    f"{fn.__qualname__}: an outlined call needs Tensors, got a "
                    "TensorSpec. Pass the tensors themselves."
                )
            if isinstance(v, Tensor):
                out.append(v)
    return out


def function(fn: Callable) -> Callable:
    """Decorator: outline ``fn`` as a cached subgraph and call it; returns the outputs tuple.

    >>> @function  # doctest: +SKIP
    ... def scale(x):
    ...     return x * 2.0
    >>> (y,) = scale(x)  # doctest: +SKIP
    """
    cache = GraphCache()

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any):
        graph = cache.create_graph(fn, *args, **kwargs)
        return ops.call(graph, *tensor_inputs(fn, args, kwargs))

    return wrapper
