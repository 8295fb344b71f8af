"""`Module.aux` and `Module.var_grad`, and graphs whose gradient must come from `build_grad`.

popxl.addons restricts both stores by phase: ``aux`` is written in `build` and read only in
`build_grad` (a tensor read there becomes a grad-graph input fed from the forward graph);
``var_grad`` is used only in `build_grad`, for tensors shaped like a named variable.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from typing import Any

import popxl_core
from popxl_core import Graph, Tensor
from popxl_core.transforms import ExpectedConnection, ExpectedConnectionType, GradGraphInfo

__all__ = [
    "AuxStore",
    "VarGradStore",
    "check_safe_to_autodiff",
    "expose_as_output",
    "fwd_connection",
    "mark_unsafe_to_autodiff",
]

_OUTSIDE = "within the `build_graph` method or outside of the `build_grad` method"


class AuxStore:
    """Forward values a custom gradient needs: ``self.aux[key] = tensor`` in `build`."""

    def __init__(self) -> None:
        self._items: dict[str, Any] = {}
        self._fetch: Callable[[Tensor], Tensor] | None = None
        self._fetched: dict[str, Any] = {}

    def __setitem__(self, key: str, value: Any) -> None:
        self._items[key] = value

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __getitem__(self, key: str) -> Any:
        if self._fetch is None:
            raise RuntimeError(
                f"aux[{key!r}]: you cannot get items {_OUTSIDE}; aux holds "
                "forward tensors for `build_grad` to read."
            )
        if key not in self._fetched:
            value = self._items[key]
            self._fetched[key] = self._fetch(value) if isinstance(value, Tensor) else value
        return self._fetched[key]

    def raw(self) -> dict[str, Any]:
        """The stored values as set in `build` (forward tensors)."""
        return dict(self._items)

    def open_for_grad(self, items: Mapping[str, Any], fetch: Callable[[Tensor], Tensor]) -> None:
        """Enter `build_grad`: a forward tensor read becomes ``fetch(tensor)``, once per key."""
        self._items, self._fetch, self._fetched = dict(items), fetch, {}


class VarGradStore:
    """Gradients of named variables, set in `build_grad`: ``self.var_grad["w"] = dw``."""

    def __init__(self) -> None:
        self._named: dict[str, Tensor] | None = None
        self._grads: dict[str, Tensor] = {}

    def _check_open(self, key: str) -> dict[str, Tensor]:
        if self._named is None:
            raise RuntimeError(
                f"var_grad[{key!r}]: you can only use var_grad inside `build_grad`, not {_OUTSIDE}."
            )
        return self._named

    def __setitem__(self, key: str, value: Any) -> None:
        named = self._check_open(key)
        if not isinstance(value, Tensor):
            raise TypeError(f"var_grad[{key!r}]: Not a tensor: {value!r}.")
        if key not in named:
            raise KeyError(
                f"var_grad[{key!r}]: Not a variable of the forward graph (named "
                f"inputs: {sorted(named)})."
            )
        var = named[key]
        if value.shape != var.shape or tuple(value.meta_shape) != tuple(var.meta_shape):
            raise ValueError(
                f"var_grad[{key!r}]: Shape or meta-shape of Tensor does not match "
                f"variable. Got {value.shape}, the variable is {var.shape}."
            )
        self._grads[key] = value

    def __getitem__(self, key: str) -> Tensor:
        self._check_open(key)
        return self._grads[key]

    def __contains__(self, key: object) -> bool:
        return key in self._grads

    def open_for_grad(self, named: Mapping[str, Tensor]) -> None:
        self._named, self._grads = dict(named), {}

    def grads(self) -> dict[str, Tensor]:
        return dict(self._grads)


# graphs whose gradient must come from their module's build_grad ----------------------------
_UNSAFE: weakref.WeakSet[Graph] = weakref.WeakSet()


def mark_unsafe_to_autodiff(graph: Graph) -> None:
    """Record that autodiff must not differentiate through ``graph`` on its own."""
    _UNSAFE.add(graph)


def check_safe_to_autodiff(graph: Graph, known: Mapping[Graph, GradGraphInfo]) -> None:
    """Raise if ``graph`` calls (at any depth) a build_grad graph with no grad info in
    ``known``: popxl's autodiff would silently differentiate its forward ops instead."""
    seen: set[Graph] = set()
    todo = list(graph.called_graphs)
    while todo:
        g = todo.pop()
        if g in seen or g in known:
            continue
        seen.add(g)
        if g in _UNSAFE:
            raise RuntimeError(
                f"Graph {g.id!r}, called from {graph.id!r}, was built by a module with a custom "
                "`build_grad` and is marked as unsafe to autodiff. Pass its GradGraphInfo in "
                "`called_graphs_grad_info` (outline the module with `call_module`, which records "
                "it)."
            )
        todo.extend(g.called_graphs)


def fwd_connection(t: Tensor) -> ExpectedConnection:
    return ExpectedConnection(t, ExpectedConnectionType.Fwd)


def expose_as_output(graph: Graph, t: Tensor) -> None:
    """Make ``t`` an output of ``graph`` so a call site can hand it to the grad graph."""
    if t not in graph.outputs:
        with graph:
            popxl_core.graph_output(t)
