"""Plain tensors that a traced call writes into: read as the written node from then on.

``buf = torch.zeros(x.shape, dtype=torch.int32)`` has no proxy argument (the shape folds to
constants), so torch.fx makes a real tensor, and a ``_tensor_constant`` node where a traced
call takes it. ``torch.cumsum(x, 0, out=buf)`` or ``buf.add_(x)`` then writes into that node,
not into ``buf``: eager code reading ``buf`` afterwards (``buf * 2``) would fold the tensor as
made (zeros) into a constant, and a traced call taking it would read a new constant node.
`plain_writes_recorded` keeps, for each such tensor, the node it was written as, and routes
every later torch call that takes the tensor through the tracer with that node in its place
(a torch function mode; `written_node` serves `capture.CaptureTracer.create_arg`). A plain
tensor drawn into in place (`capture_random.drawn_node`) is followed the same way.
Another plain tensor sharing memory with a followed one (a view of it, or its base) keeps
the values as made: reading it is reported, never a silent stale value.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch import nn
from torch.overrides import TorchFunctionMode, is_tensor_method_or_property

from .capture_random import drawn_node
from .inplace import mutated_input
from .out_kwarg import out_target

__all__ = ["STALE_READ", "note_write", "plain_writes_recorded", "written_node"]

# the kind of the issue recorded for a read of memory shared with a followed tensor
STALE_READ = "untraced write"
_STALE_HINT = (
    "a traced call wrote into a tensor forward made from constants, and this tensor shares "
    "its memory (a view or the base) without being traced: make the tensor from the input "
    "(torch.zeros_like(x)) or use the value the call returns."
)


def _plain(value: Any) -> bool:
    """A real tensor that is not a parameter: a proxy or a parameter is traced already."""
    return isinstance(value, torch.Tensor) and not isinstance(value, (nn.Parameter, fx.Proxy))


def written_node(tracer: fx.Tracer, value: Any) -> fx.Node | None:
    """The node the plain tensor ``value`` stands for since a traced call wrote into it
    (or drew into it), if one did."""
    written = getattr(tracer, "written_tensors", {}).get(id(value))
    if written is not None and written[0] is value:
        return written[1]
    return drawn_node(tracer, value)


def note_write(tracer: fx.Tracer, proxy: Any, args: tuple, kwargs: dict) -> None:
    """Follow the plain tensor that the call just traced as ``proxy`` writes into
    (``out=`` or in place): it is that call's written node from now on."""
    node = proxy.node if isinstance(proxy, fx.Proxy) else None
    if node is None or node.op not in ("call_function", "call_method"):
        return
    target, plain = out_target(node), kwargs.get("out")
    if target is None:
        target, plain = mutated_input(node, None), args[0] if args else None
    table = getattr(tracer, "written_tensors", None)  # None: outside `plain_writes_recorded`
    if table is not None and target is not None and _plain(plain):
        table[id(plain)] = (plain, target)


def _any_proxy(values: list) -> bool:
    return any(isinstance(v, fx.Proxy) for v in values)


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr() if t.layout == torch.strided else 0


def _followed(tracer: fx.Tracer) -> list[torch.Tensor]:
    """The plain tensors followed: written into, or drawn into (`capture_random`)."""
    tables = (getattr(tracer, "written_tensors", {}), getattr(tracer, "drawn_tensors", {}))
    return [t for table in tables for t, _ in table.values()]


class _FollowWrites(TorchFunctionMode):
    """Every torch call taking a followed plain tensor, traced with its node instead."""

    def __init__(self, tracer: fx.Tracer) -> None:
        super().__init__()
        self.tracer = tracer

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None):
        kwargs = kwargs or {}
        tracer = self.tracer  # the common case first, cheaply: nothing followed yet
        if not (tracer.written_tensors or getattr(tracer, "drawn_tensors", None)):
            return func(*args, **kwargs)
        if getattr(tracer, "_evaluating", False):  # an example value, on copies
            return func(*args, **kwargs)
        swapped = pytree.tree_map(self._swap, (args, kwargs))
        leaves = pytree.tree_leaves(swapped)
        if getattr(func, "__name__", "") == "__setitem__" and _any_proxy(leaves):
            return self._assign(args[0], *swapped[0])  # also a traced value into a plain one
        if all(a is b for a, b in zip(leaves, pytree.tree_leaves((args, kwargs)))):
            return func(*args, **kwargs)
        return self._traced(func, *swapped)

    def _swap(self, value: Any) -> Any:
        if not _plain(value):
            return value
        node = written_node(self.tracer, value)
        if node is not None:
            return self.tracer.proxy(node)
        self._check_shared(value)
        return value

    def _check_shared(self, value: torch.Tensor) -> None:
        """Report a read of memory that a followed tensor shares (its values are stale)."""
        ptr = _storage(value)
        if ptr and any(_storage(t) == ptr for t in _followed(self.tracer)):
            self.tracer.record(None, STALE_READ, "a tensor sharing memory with one a traced "
                               "call wrote into is read by untraced code", _STALE_HINT)  # fmt: skip

    def _traced(self, func: Any, args: tuple, kwargs: dict) -> Any:
        name = getattr(func, "__name__", "")
        if name == "__get__":  # a property (``buf.T``, ``buf.shape``): the proxy's
            return getattr(args[0], func.__self__.__name__)
        if is_tensor_method_or_property(func):  # the method (or operator) of args[0]
            return getattr(args[0], name)(*args[1:], **kwargs)
        return func(*args, **kwargs)

    def _assign(self, plain: torch.Tensor, target: Any, index: Any, value: Any) -> None:
        """``plain[index] = value`` (``target`` is ``plain`` swapped), traced: ``plain``
        is followed as the assignment's node from now on (`capture_calls.assign_item`)."""
        if not isinstance(target, fx.Proxy):  # a plain tensor given a followed one's value
            target = self.tracer.proxy(self.tracer.create_arg(plain))
        target[index] = value
        if not isinstance(plain, fx.Proxy):
            self.tracer.written_tensors[id(plain)] = (plain, target.node)


@contextlib.contextmanager
def plain_writes_recorded(tracer: fx.Tracer) -> Iterator[None]:
    """While tracing, follow plain tensors written by traced calls (the module docstring)."""
    tracer.written_tensors = {}
    try:
        with _FollowWrites(tracer):
            yield
    finally:
        tracer.written_tensors = {}
