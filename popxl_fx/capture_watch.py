"""Hooks a front end opens around the forward a capture traces: watchers see each node as it
is made (poptorch's ``MultiConv`` counts its convolutions), and rules may rewrite a call's
arguments or trace through a leaf module (poptorch's half-precision rule casts parameters).

A watcher is a callable ``(node, module)``: ``module`` is the called submodule for a
``call_module`` node and None otherwise. A `Rule` rewrites. Outside `watching` / `ruling`
the capture is unchanged.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch.fx as fx
from torch import nn

__all__ = ["Rule", "call_args", "notify", "ruling", "trace_through", "watching"]

_WATCHERS: list[Callable[[fx.Node, Any], None]] = []
_RULES: list[Rule] = []


class Rule(Protocol):
    def call_args(self, tracer: fx.Tracer, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """The arguments a function or method call is traced with."""

    def trace_through(self, module: nn.Module, args: tuple, kwargs: dict) -> Callable | None:
        """What this call of a leaf module is traced as instead of one node: a function
        ``(forward, *args, **kwargs)`` (``forward`` runs the module's own code), or None."""


@contextlib.contextmanager
def _pushed(stack: list, item: Any) -> Iterator[None]:
    stack.append(item)
    try:
        yield
    finally:
        stack.remove(item)


def watching(watcher: Callable[[fx.Node, Any], None]) -> contextlib.AbstractContextManager:
    """Call ``watcher`` with every node captured until the block ends."""
    return _pushed(_WATCHERS, watcher)


def ruling(rule: Rule) -> contextlib.AbstractContextManager:
    """Apply ``rule`` to the calls captured until the block ends."""
    return _pushed(_RULES, rule)


def notify(node: fx.Node, root: Any) -> None:
    """Tell the watchers about ``node`` (of the graph traced from module ``root``)."""
    if not _WATCHERS:
        return
    module = root.get_submodule(node.target) if node.op == "call_module" else None
    for watcher in list(_WATCHERS):
        watcher(node, module)


def call_args(tracer: fx.Tracer, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """A call's arguments after every rule."""
    for rule in list(_RULES):
        args, kwargs = rule.call_args(tracer, args, kwargs)
    return args, kwargs


def trace_through(module: nn.Module, args: tuple, kwargs: dict) -> Callable | None:
    """The first rule's function to trace this leaf module's call through, or None."""
    for rule in list(_RULES):
        through = rule.trace_through(module, args, kwargs)
        if through is not None:
            return through
    return None
