"""Watchers of the nodes a capture makes: a front end (poptorch's ``MultiConv`` scope) sees
each node as the trace creates it, with the module it calls, while its scope is open.

A watcher is a callable ``(node, module)``: ``module`` is the called submodule for a
``call_module`` node and None otherwise. Outside `watching` nothing is called.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch.fx as fx

__all__ = ["notify", "watching"]

_WATCHERS: list[Callable[[fx.Node, Any], None]] = []


@contextlib.contextmanager
def watching(watcher: Callable[[fx.Node, Any], None]) -> Iterator[None]:
    """Call ``watcher`` with every node captured until the block ends."""
    _WATCHERS.append(watcher)
    try:
        yield
    finally:
        _WATCHERS.remove(watcher)


def notify(node: fx.Node, root: Any) -> None:
    """Tell the watchers about ``node`` (of the graph traced from module ``root``)."""
    if not _WATCHERS:
        return
    module = root.get_submodule(node.target) if node.op == "call_module" else None
    for watcher in list(_WATCHERS):
        watcher(node, module)
