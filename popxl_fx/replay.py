"""A second trace of a model that reuses the first trace's example values where they are
provably the same, so that tracing twice (`check`: do shapes change between calls?) runs the
model's arithmetic once.

Node k of the second trace takes node k's example value from the first trace when it is the
same call (op, target, constant arguments equal, every node argument the twin of the same
node of the first trace) on the same module state; placeholders and attributes are twins when
they are the same object (or equal constants). Anything else, and everything computed from it,
is evaluated eagerly as in the first trace. What makes shapes differ between calls (Python
state read by ``forward``: a changed constant, a changed module attribute, a replaced tensor,
another graph) breaks the twinning where it starts, so the comparison of the two traces sees
it. Values are not compared: the second trace is used for its shapes only.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx
from torch import nn

__all__ = ["MISSING", "Replay", "module_state"]

MISSING = object()  # no reusable value: evaluate the node
_SIMPLE = (
    int,
    float,
    bool,
    str,
    type(None),
    torch.dtype,
    torch.device,
    torch.layout,
    torch.memory_format,
    type(Ellipsis),
)


def module_state(module: nn.Module) -> tuple:
    """What a leaf module's output shape can depend on besides its inputs: the plain
    attributes of it and its children, and the identity, shape and dtype of their tensors."""
    state: list[tuple[Any, Any]] = []
    for sub in module.modules():
        for key, value in vars(sub).items():
            if key in ("_parameters", "_buffers"):
                state.append((key, tuple(_tensor_key(n, t) for n, t in value.items())))
            elif key == "_modules":
                state.append((key, tuple((n, id(m)) for n, m in value.items())))
            elif isinstance(value, torch.Tensor):
                state.append(_tensor_key(key, value))
            elif isinstance(value, dict):
                state.append((key, len(value)))  # hooks: one added shows as a new length
            elif _plain(value):
                state.append((key, value))
            else:
                state.append((key, id(value)))
    return tuple(state)


def _tensor_key(name: str, t: Any) -> tuple:
    if t is None:
        return (name, None)
    return (name, id(t), tuple(t.shape), t.dtype)


def _plain(value: Any) -> bool:
    if isinstance(value, (tuple, list)):
        return all(_plain(v) for v in value)
    return isinstance(value, _SIMPLE)


class Replay:
    """The first trace's nodes, matched position by position against a second trace."""

    def __init__(self, first: fx.Graph) -> None:
        self._first = [n for n in first.nodes if n.op != "output"]
        self._next = 0
        self._twin: dict[fx.Node, fx.Node] = {}  # second-trace node -> equal first-trace node
        self.reused = 0

    def reuse(self, node: fx.Node, root: nn.Module) -> Any:
        """The first trace's value for ``node`` if it is the same call on the same values,
        else `MISSING`. Call once per created node, in order."""
        k, self._next = self._next, self._next + 1
        ref = self._first[k] if k < len(self._first) else None
        if ref is None or ref.op != node.op or ref.target != node.target:
            return MISSING
        if node.op in ("placeholder", "get_attr"):
            return MISSING  # fetched, then `settle` decides whether it is the same
        if not self._same_args((node.args, node.kwargs), (ref.args, ref.kwargs)):
            return MISSING
        if node.op == "call_module":
            if module_state(root.get_submodule(node.target)) != ref.meta.get("module_state"):
                return MISSING
        self._twin[node] = ref
        self.reused += 1
        return ref.meta["example_value"]

    def settle(self, node: fx.Node, value: Any) -> None:
        """After a placeholder or attribute is fetched: it is a twin if it is the same object
        as the first trace's, or an equal constant (a ``_tensor_constant`` made again)."""
        k = self._next - 1
        ref = self._first[k] if 0 <= k < len(self._first) else None
        if ref is None or ref.op != node.op or ref.target != node.target:
            return
        first = ref.meta.get("example_value")
        if value is first or (
            isinstance(value, torch.Tensor)
            and isinstance(first, torch.Tensor)
            and value.dtype == first.dtype
            and value.shape == first.shape
            and value.device == first.device
            and torch.equal(value, first)
        ):
            self._twin[node] = ref

    def _same_args(self, a: Any, b: Any) -> bool:
        if isinstance(a, fx.Node):
            return isinstance(b, fx.Node) and self._twin.get(a) is b
        if type(a) is not type(b):
            return False
        if isinstance(a, (tuple, list)):
            return len(a) == len(b) and all(self._same_args(x, y) for x, y in zip(a, b))
        if isinstance(a, dict):
            return a.keys() == b.keys() and all(self._same_args(a[k], b[k]) for k in a)
        if isinstance(a, slice):
            return all(
                self._same_args(x, y)
                for x, y in zip((a.start, a.stop, a.step), (b.start, b.stop, b.step))
            )
        return isinstance(a, _SIMPLE) and a == b
