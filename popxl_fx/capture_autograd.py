"""Custom ``torch.autograd.Function`` s met while tracing, kept whole.

torch.fx traces ``Fn.apply(x)`` into ``Fn.forward``'s ops, and the graph's gradient would then
be autodiff's of those ops, not ``Fn.backward``: BLOOM's GeLU (a hand-written tanh-gelu
backward), a straight-through estimator or a gradient-reversal layer would train with another
gradient and no word. `autograd_functions_recorded` makes each such call one node whose
target is `AutogradCall`; it lowers to one ``Aten`` op running ``Fn.apply`` (forward) and
autograd through it (``Fn.backward``): eager's numbers both ways. (``Fn.apply`` is looked
up when called, as code writes it; a bound ``f = Fn.apply`` taken before the capture began
runs the forward's ops.)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from .lowering import lookup, lowers
from .lowerings.aten_kernels import lower_torch_function

__all__ = ["AutogradCall", "autograd_functions_recorded"]


@dataclass(frozen=True)
class AutogradCall:
    """``function.apply(*args, **kwargs)``: the target of a custom autograd function's node."""

    function: type[torch.autograd.Function]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.function.apply(*args, **kwargs)

    def __str__(self) -> str:
        return f"{self.function.__qualname__}.apply"

    @property
    def __name__(self) -> str:  # fx names the node after its target
        return f"{self.function.__name__}_apply"


@contextlib.contextmanager
def autograd_functions_recorded(tracer: fx.Tracer) -> Iterator[None]:
    """While tracing, record ``Fn.apply(...)`` with a traced tensor among its arguments as
    one node (see the module docstring)."""
    base = torch.autograd.Function
    original = vars(base)["apply"]

    def apply(cls: type, *args: Any, **kwargs: Any) -> Any:
        leaves = pytree.tree_leaves((args, kwargs))
        if getattr(tracer, "_evaluating", False) or not any(
            isinstance(a, fx.Proxy) for a in leaves
        ):
            return original.__get__(None, cls)(*args, **kwargs)
        target = AutogradCall(cls)
        if lookup(target) is None:
            lowers(target)(lower_torch_function)
        return tracer.create_proxy("call_function", target, args, kwargs)

    base.apply = classmethod(apply)
    try:
        yield
    finally:
        base.apply = original
