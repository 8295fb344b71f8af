"""Hidden state met while tracing: torch's random factories and tensors held as plain
attributes.

``torch.randn(4, 8)`` (or ``torch.randint(0, 5, x.shape)``: the shape folds to constants) has
no proxy argument, so torch.fx would run it once and freeze the draw into the graph as a
constant. `random_factories_recorded` makes such calls nodes of the graph instead; they lower
like any call (the fallback draws from the simulator's seeded stream, or reports the op).

A tensor held as a plain attribute (not a parameter or buffer) is not traced: updating it in
place in ``forward`` changes the model behind the graph's back. `plain_tensors` lists them so
the trace can restore them and report the update.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch import nn

from .errors import Issue

__all__ = [
    "plain_update_issues",
    "RANDOM_FACTORIES",
    "changed_plain_tensors",
    "plain_tensors",
    "random_factories_recorded",
]

# torch functions that draw random numbers and may be called with only Python arguments
RANDOM_FACTORIES = ("rand", "randn", "randint", "randperm", "normal")


def plain_tensors(model: nn.Module) -> dict[tuple[str, str], torch.Tensor]:
    """Tensors held as plain attributes (not parameters or buffers) of ``model`` and its
    submodules, by (module path, attribute)."""
    return {
        (path, name): value
        for path, module in model.named_modules()
        for name, value in vars(module).items()
        if isinstance(value, torch.Tensor)
    }


def changed_plain_tensors(model: nn.Module, before: dict) -> list[str]:
    """Qualified names of the plain tensor attributes that differ from ``before``
    (a snapshot of `plain_tensors`)."""
    changed = []
    for key, t in plain_tensors(model).items():
        old = before.get(key)
        if old is not None and (old.shape != t.shape or not torch.equal(old, t.detach())):
            changed.append(".".join(p for p in key if p))
    return changed


def plain_update_issues(graph: fx.Graph, changed: list[str]) -> list[Issue]:
    """One issue per plain tensor attribute the forward changed."""
    reads = {n.target: n for n in graph.nodes if n.op == "get_attr"}
    calls = [n for n in graph.nodes if n.op == "call_module"]
    issues = []
    for name in changed:  # where the graph reads it, or calls the leaf module holding it
        node = reads.get(name) or next((n for n in calls if name.startswith(f"{n.target}.")), None)
        issues.append(
            Issue(
                "hidden state",
                f"the plain tensor attribute '{name}' is updated in place by forward",
                node.meta.get("source", "<unknown>") if node is not None else "<unknown>",
                name.rsplit(".", 1)[0] if "." in name else "",
                node.name if node is not None else "",
                "eager torch keeps the new value for the next call, a static program would "
                "not; register it with `self.register_buffer(...)`.",
            )
        )
    return issues


def _has_proxy(args: Any) -> bool:
    return any(isinstance(a, fx.Proxy) for a in pytree.tree_leaves(args))


@contextlib.contextmanager
def random_factories_recorded(tracer: fx.Tracer) -> Iterator[None]:
    """While tracing, record ``torch.<factory>(...)`` calls without proxy arguments as
    call_function nodes (target: the torch function) instead of running them once."""
    originals = {name: getattr(torch, name) for name in RANDOM_FACTORIES}

    def recorded(fn):
        def call(*args: Any, **kwargs: Any) -> Any:
            if getattr(tracer, "_evaluating", False) or _has_proxy((args, kwargs)):
                return fn(*args, **kwargs)
            return tracer.create_proxy("call_function", fn, args, kwargs)

        return call

    try:
        for name, fn in originals.items():
            setattr(torch, name, recorded(fn))
        yield
    finally:
        for name, fn in originals.items():
            setattr(torch, name, fn)
