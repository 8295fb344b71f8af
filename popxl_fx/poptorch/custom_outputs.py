"""Outputs of custom types: what a model returns that a ``registerCustomArgParser`` parser
knows (or a dict subclass, which PopTorch takes without one).

The program returns tensors only, so the wrapper hands popxl_fx each such output as the
tuple of tensors its parser yields (`CustomOutputs.plain`), and the executor rebuilds it
around the program's tensors with the parser's ``reconstruct`` (`CustomOutputs.rebuild`), as
PopTorch rebuilds its outputs' structure.

While the model is captured its tensors are torch.fx proxies, which are no ``torch.Tensor``:
a parser that yields only ``isinstance(x, torch.Tensor)`` values (PopTorch's own examples do)
would yield none of them. So ``yieldTensors`` reads a twin of the object whose proxies are
their example tensors; what it yields is mapped back to the proxies. The twin is also the
structure that ``reconstruct`` is given on the host (PopTorch gives the traced structure).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from .args import DICT_SUBCLASS_PARSER, parser_for
from .errors import Error

__all__ = ["CustomOutputs"]


class CustomOutputs:
    """The custom-typed outputs of the last forward traced, and how to rebuild them."""

    def __init__(self) -> None:
        self._spec: pytree.TreeSpec | None = None  # custom-typed objects as leaves
        self._customs: dict[int, tuple] = {}  # leaf index -> (parser, twin)

    def plain(self, out: Any) -> Any:
        """``out`` with every custom-typed object replaced by the tuple of its tensors."""
        leaves, spec = pytree.tree_flatten(out, is_leaf=_is_custom)
        customs = {i: x for i, x in enumerate(leaves) if _is_custom(x)}
        self._spec = spec if customs else None
        self._customs = {}
        for i, value in customs.items():
            parser, (twin, proxies) = parser_for(value), _twin(value)
            assert parser is not None  # `_is_custom`: a parser is registered for its type
            leaves[i] = tuple(proxies.get(id(t), t) for t in parser.yieldTensors(twin))
            self._customs[i] = (parser, twin)
        return pytree.tree_unflatten(leaves, spec) if customs else out

    def plain_only(self) -> bool:
        """The last forward traced returns no custom-typed object (`rebuild` keeps all)."""
        return self._spec is None

    def rebuild(self, plain: Any) -> Any:
        """The executor's outputs (`plain`'s structure) with the custom objects rebuilt."""
        if self._spec is None:
            return plain
        leaves = self._spec.flatten_up_to(plain)
        for i, (parser, twin) in self._customs.items():
            leaves[i] = parser.reconstruct(twin, iter(leaves[i]))
        return pytree.tree_unflatten(leaves, self._spec)


def _is_custom(x: Any) -> bool:
    """A registered parser's type, or a dict subclass that popxl_fx does not return itself
    (it returns dataclasses, HuggingFace's ModelOutputs among them, as they are)."""
    parser = parser_for(x)
    if parser is DICT_SUBCLASS_PARSER:
        return not dataclasses.is_dataclass(x)
    return parser is not None


def _twin(value: Any) -> tuple[Any, dict[int, fx.Proxy]]:
    """A shallow copy of ``value`` whose proxies (in its attributes or, for a mapping, its
    items) are tensors, and which proxy each of those tensors stands for (by id)."""
    proxies: dict[int, fx.Proxy] = {}

    def swap(leaf: Any) -> Any:
        example = leaf.node.meta.get("example_value")
        if not isinstance(example, torch.Tensor):
            raise Error(
                f"a {type(value).__name__} output holds {leaf.node.name}, which is not a "
                "tensor: a custom output type may hold tensors and constants only."
            )
        tensor = example.detach()  # a new object per place: its id names this proxy
        proxies[id(tensor)] = leaf
        return tensor

    twin = copy.copy(value)
    if isinstance(twin, dict):
        for key, item in list(twin.items()):
            twin[key] = pytree.tree_map_only(fx.Proxy, swap, item)
    if hasattr(twin, "__dict__"):
        vars(twin).update(pytree.tree_map_only(fx.Proxy, swap, dict(vars(twin))))
    return twin, proxies
