"""Random draws into tensors that are not traced: recorded as nodes, not frozen.

``torch.distributions.Bernoulli(0.5).sample(x.shape)`` calls ``torch.bernoulli`` on a
plain tensor, and ``Exponential(0.5).sample(...)`` calls ``t.exponential_()`` on one.
torch.fx sees no proxy there. It would draw once, while tracing, and freeze the numbers into
the graph, so every step would return the same draws. `random_draws_recorded` makes each such
call a node of the graph instead (`capture_state` does so for ``torch.rand(4)`` and the other
factories). A plain tensor drawn into in place reads as that node wherever forward uses it
later, in a traced call or in eager code (`drawn_node`, followed by `capture_writes`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch import nn

__all__ = ["RANDOM_FUNCTIONS", "RANDOM_METHODS", "drawn_node", "random_draws_recorded"]

# torch functions that draw, given plain tensors (the factories without tensors:
# `capture_state.RANDOM_FACTORIES`)
RANDOM_FUNCTIONS = ("bernoulli", "poisson", "multinomial", "rand_like", "randn_like")
# Tensor methods that draw into their tensor
RANDOM_METHODS = (
    "uniform_",
    "normal_",
    "random_",
    "bernoulli_",
    "exponential_",
    "geometric_",
    "cauchy_",
    "log_normal_",
)


def _traced(tracer: fx.Tracer, values: Any) -> bool:
    """Whether the call is the tracer's already (a proxy among ``values``), or an eager
    computation of an example value."""
    leaves = pytree.tree_leaves(values)
    return getattr(tracer, "_evaluating", False) or any(isinstance(v, fx.Proxy) for v in leaves)


def _function(tracer: fx.Tracer, fn: Callable) -> Callable:
    def call(*args: Any, **kwargs: Any) -> Any:
        if _traced(tracer, (args, kwargs)):
            return fn(*args, **kwargs)
        return tracer.create_proxy("call_function", fn, args, kwargs)

    return call


def _method(tracer: fx.Tracer, name: str, method: Callable) -> Callable:
    def call(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        # a Parameter drawn into is an initialiser (nn.init on a module made in forward)
        if isinstance(self, nn.Parameter) or _traced(tracer, (args, kwargs)):
            return method(self, *args, **kwargs)
        # drawn into a copy: the plain tensor is forward's own (``torch.empty(n)``), fresh
        # every call, not state the program keeps between steps
        copy = tracer.create_proxy("call_method", "clone", (self,), {})
        proxy = tracer.create_proxy("call_method", name, (copy, *args), kwargs)
        tracer.drawn_tensors[id(self)] = (self, proxy.node)
        return proxy

    return call


def drawn_node(tracer: fx.Tracer, value: Any) -> fx.Node | None:
    """The node that drew into the plain tensor ``value`` in place, if one did."""
    drawn = getattr(tracer, "drawn_tensors", {}).get(id(value))
    return drawn[1] if drawn is not None and drawn[0] is value else None


@contextlib.contextmanager
def random_draws_recorded(tracer: fx.Tracer) -> Iterator[None]:
    """While tracing, record draws on plain tensors as nodes (see the module docstring)."""
    tracer.drawn_tensors = {}
    patches = [(torch, n, _function(tracer, getattr(torch, n))) for n in RANDOM_FUNCTIONS]
    patches += [
        (torch.Tensor, n, _method(tracer, n, getattr(torch.Tensor, n))) for n in RANDOM_METHODS
    ]
    # torch.Tensor inherits the methods from its C base: put back means remove the patch
    saved = [(owner, n, owner.__dict__.get(n)) for owner, n, _ in patches]
    try:
        for owner, n, fn in patches:
            setattr(owner, n, fn)
        yield
    finally:
        for owner, n, old in saved:
            if old is None:
                delattr(owner, n)
            else:
                setattr(owner, n, old)
        tracer.drawn_tensors = {}
