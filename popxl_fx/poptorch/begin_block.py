"""``poptorch.BeginBlock``, ``removeBlocks`` and ``module_repr``: blocks marked on modules.

As in PopTorch, a mark is a forward pre-hook of the module, so it lives in the module's own
state: copies, deep copies and pickles of the module keep it, and `module_repr` prints it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch

from .blocks import _check_ids, record
from .errors import Error

__all__ = ["BeginBlock", "LegacyBeginBlockFn", "marked_blocks", "module_repr", "removeBlocks"]


class _BlockHook:
    """The pre-hook that opens block ``user_id`` (on ``ipu_id``) each time the module runs."""

    def __init__(self, user_id, ipu_id) -> None:
        self._user_id, self._ipu_id = user_id, ipu_id

    def __call__(self, module, inputs) -> None:
        record(self._user_id, self._ipu_id)

    def __repr__(self) -> str:
        return f"BeginBlock(user_id={self._user_id}, ipu_id={self._ipu_id})"


class LegacyBeginBlockFn(torch.nn.Module):
    """A function given to BeginBlock (PopTorch still accepts one): called inside its block."""

    def __init__(self, layer_to_call: Callable, user_id=None, ipu_id=None) -> None:
        super().__init__()
        self._layer_to_call, self._user_id, self._ipu_id = layer_to_call, user_id, ipu_id

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        record(self._user_id, self._ipu_id)
        return self._layer_to_call(*args, **kwargs)


def BeginBlock(layer_to_call, user_id=None, ipu_id: int | None = None):
    """Start a block at ``layer_to_call`` (the module itself is returned, marked)."""
    _check_ids(user_id, ipu_id)
    if not isinstance(layer_to_call, torch.nn.Module):
        if callable(layer_to_call):
            return LegacyBeginBlockFn(layer_to_call, user_id, ipu_id)
        raise Error("module is not an instance of torch.nn.Module or function.")
    if _hooks(layer_to_call):
        raise Error("module has already been assigned to a block.")
    layer_to_call.register_forward_pre_hook(_BlockHook(user_id, ipu_id))
    return layer_to_call


def _hooks(module: torch.nn.Module) -> list[_BlockHook]:
    return [h for h in module._forward_pre_hooks.values() if isinstance(h, _BlockHook)]


def removeBlocks(module: torch.nn.Module) -> None:
    """Remove every BeginBlock mark from ``module`` and its children."""
    if not isinstance(module, torch.nn.Module):
        raise Error("removeBlocks takes a torch.nn.Module.")
    for m in module.modules():
        kept = [(k, h) for k, h in m._forward_pre_hooks.items() if not isinstance(h, _BlockHook)]
        m._forward_pre_hooks = OrderedDict(kept)


def marked_blocks(model: torch.nn.Module) -> list:
    """The (user_id, ipu_id) of each BeginBlock mark in ``model``, in module order (a traced
    leaf module does not run its hooks, so the marks are read from the modules)."""
    return [(h._user_id, h._ipu_id) for m in model.modules() for h in _hooks(m)]


def module_repr(m: torch.nn.Module) -> str:
    """``repr(m)`` with each module's BeginBlock marks printed before its name."""
    extra = m.extra_repr().split("\n") if m.extra_repr() else []
    children = [f"({k}): " + _indent(module_repr(c)) for k, c in m._modules.items()]
    hooks = "".join(f"{h!r} " for h in m._forward_pre_hooks.values())
    text = f"{hooks}{m._get_name()}("
    if len(extra) == 1 and not children:
        text += extra[0]
    elif extra or children:
        text += "\n  " + "\n  ".join(extra + children) + "\n"
    return text + ")"


def _indent(text: str) -> str:
    return "\n  ".join(text.split("\n"))
