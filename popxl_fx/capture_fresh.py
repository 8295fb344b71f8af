"""Tensors a model's ``forward`` makes from Python values (``torch.zeros(100)``): torch.fx
turns each into a ``_tensor_constant`` attribute, like a tensor the model holds, but a new
one is made at every eager call, so updating it in place is no hidden state.

While a trace runs, `fresh_factories_marked` records the tensors these factories return;
the capture marks a ``get_attr`` node of one with ``meta["made_in_forward"]`` (`is_fresh`)
and gives it a copy as its example value, so that the example run's in-place updates leave
the constant the program reads as it was made. The hidden-state check leaves its in-place
updates alone.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from typing import Any

import torch
import torch.fx as fx

__all__ = ["FRESH_FACTORIES", "fresh_factories_marked", "is_fresh"]

# deterministic torch factories callable with Python values only
FRESH_FACTORIES = ("zeros", "ones", "full", "empty", "tensor", "arange", "eye", "linspace")


def _recording(fn, made: dict) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        out = fn(*args, **kwargs)
        if isinstance(out, torch.Tensor) and not isinstance(out, fx.Proxy):
            made[id(out)] = weakref.ref(out)
        return out

    return call


@contextlib.contextmanager
def fresh_factories_marked(tracer: fx.Tracer) -> Iterator[None]:
    """Record, in ``tracer.made_in_forward``, the tensors the factories make while tracing."""
    made: dict[int, weakref.ref] = {}
    tracer.made_in_forward = made
    originals = {name: getattr(torch, name) for name in FRESH_FACTORIES}
    try:
        for name, fn in originals.items():
            setattr(torch, name, _recording(fn, made))
        yield
    finally:
        for name, fn in originals.items():
            setattr(torch, name, fn)


def is_fresh(tracer: fx.Tracer, value: Any) -> bool:
    """Whether ``value`` is a tensor a factory made during ``tracer``'s trace."""
    ref = getattr(tracer, "made_in_forward", {}).get(id(value))
    return ref is not None and ref() is value
