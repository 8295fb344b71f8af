"""Hidden state met while tracing: torch's random factories and tensors held as plain
attributes.

``torch.randn(4, 8)`` (or ``torch.randint(0, 5, x.shape)``: the shape folds to constants) has
no proxy argument, so torch.fx would run it once and freeze the draw into the graph as a
constant. `random_factories_recorded` makes such calls nodes of the graph instead; they lower
like any call (the fallback draws from the simulator's seeded stream, or reports the op).

A tensor held as a plain attribute (not a parameter or buffer) is not traced: updating it in
place in ``forward`` changes the model behind the graph's back. `plain_tensors` lists them so
the trace can restore them and report the update. `preserved` and `trace_module` run eager
code and traces on a model without changing it (buffers, plain tensors, torch's RNG).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch import nn
from torch.fx._lazy_graph_module import _LazyGraphModule

from . import trace_patch
from .capture_autograd import autograd_functions_recorded
from .capture_effects import python_effects_recorded
from .capture_random import random_draws_recorded
from .capture_writes import plain_writes_recorded
from .errors import Issue

__all__ = [
    "plain_update_issues",
    "RANDOM_FACTORIES",
    "changed_plain_tensors",
    "plain_tensors",
    "preserved",
    "random_factories_recorded",
    "trace_graph",
    "trace_module",
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


@contextlib.contextmanager
def preserved(model: nn.Module) -> Iterator[dict[tuple[str, str], torch.Tensor]]:
    """Run eager code on ``model`` without changing its buffers, its plain tensor
    attributes or the torch RNG. Yields the copies of the plain tensors as they were
    (`changed_plain_tensors` compares with them)."""
    saved = {name: b.detach().clone() for name, b in model.named_buffers()}
    plain = {key: t.detach().clone() for key, t in plain_tensors(model).items()}
    with torch.random.fork_rng(devices=[]):
        try:
            yield plain
        finally:
            with torch.no_grad():
                for name, b in model.named_buffers():
                    b.copy_(saved[name])
                for key, t in plain_tensors(model).items():
                    if key in plain and t.shape == plain[key].shape:
                        t.copy_(plain[key])


def trace_module(tracer: fx.Tracer, model: nn.Module) -> fx.GraphModule:
    """Trace ``model`` with ``tracer`` (a `capture.CaptureTracer`) and leave the model as it
    was.

    torch.fx stores tensors that the forward creates from constants as ``_tensor_constantN``
    attributes of the root; the graph module keeps them, the user's model does not.

    The graph module is torch's lazy kind: its Python code is generated and compiled when
    first called or read (``gm.code``), not when made. The lowering, the checks and the phase
    split only read the graph (the code took 1.5 % of the test suite's CPU time).
    """
    name = type(model).__name__
    return _traced(tracer, model, lambda graph: _LazyGraphModule(model, graph, class_name=name))


def trace_graph(tracer: fx.Tracer, model: nn.Module) -> fx.Graph:
    """`trace_module`'s graph alone, for a trace that is only compared (`check`'s second
    trace): no GraphModule, whose Python code torch.fx generates and compiles, is made."""
    return _traced(tracer, model, lambda graph: graph)


def _override_tables_filled() -> None:
    """Fill torch.overrides' cached tables of torch's functions before the recorders patch
    any. A table first built while ``torch.rand`` is a recording wrapper keeps that wrapper,
    and through its closure the tracer and the traced model, for the rest of the process: a
    1 B-parameter model's 4 GiB of weights stayed alive after its trainer was gone."""
    torch.overrides.get_ignored_functions()
    torch.overrides.get_testing_overrides()
    torch.overrides._get_tensor_methods()


def _traced(tracer: fx.Tracer, model: nn.Module, keep: Callable[[fx.Graph], Any]) -> Any:
    """``keep(graph)`` of the trace, made before the constants fx added to ``model`` go."""
    _override_tables_filled()
    before = set(vars(model))
    try:
        with preserved(model) as plain:
            with (
                random_factories_recorded(tracer),
                random_draws_recorded(tracer),
                autograd_functions_recorded(tracer),
                python_effects_recorded(tracer, model),
                plain_writes_recorded(tracer),
            ):
                graph = trace_patch.trace(tracer, model)
            tracer.issues += plain_update_issues(graph, changed_plain_tensors(model, plain))
        return keep(graph)
    finally:
        for name in set(vars(model)) - before:
            if name.startswith("_tensor_constant"):
                delattr(model, name)
