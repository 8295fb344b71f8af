"""torch.fx capture that keeps the module hierarchy and runs the example inputs alongside.

Every node gets, in ``node.meta``:
  - ``example_value``: its value on the example inputs (this is the shape propagation: the
    node's shape and dtype; the trace runs the model once, eagerly, without changing it);
  - ``module_path``: qualified name of the torch module whose code created it;
  - ``source``: the user's ``file:line`` that created it (and ``node.stack_trace``: the
    user's frames from the outermost ``forward`` in).
Python values derived from shapes (``x.shape``, ``x.size()``, ``x.dim()``, ``len(x)``) are
folded into constants while tracing, so the graph is specialised to the example shapes.
Standard ``torch.nn`` modules with a lowering (or without children) stay leaves; user modules
and containers are traced through. What cannot become a static graph (``.item()``, control
flow on tensor values, data-dependent shapes and lengths) is recorded as `Issue`s, and tracing
goes on with the example's concrete value so that one pass finds every problem (the proxy
that answers those questions is `popxl_fx.capture_proxy`, the checks `capture_static`).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
from torch import nn
from torch.nn.utils.parametrize import is_parametrized

from .calls import POSITIONAL, Binding
from .capture_calls import RootCalls, static_index
from .capture_proxy import CaptureProxy, describe
from .capture_state import preserved, trace_graph, trace_module
from .capture_static import StaticChecks
from .capture_watch import call_args, notify, trace_through
from .capture_writes import note_write, written_node
from .errors import Issue, user_frame, user_stack
from .inplace import is_made_constant
from .lowering import lookup
from .outside_state import reads_outside_state
from .replay import MISSING, Replay, module_state

__all__ = [
    "EXAMPLE_NOTE",
    "CaptureTracer",
    "Captured",
    "capture",
    "is_leaf",
    "settle_first_call_flags",
    "preserved",
    "trace_module",
]

# Tensor methods and functions whose result only depends on the shape/dtype: folded (the
# attributes, `FOLDED_ATTRS`, fold in `CaptureProxy`).
_FOLDED_METHODS = frozenset(
    {
        "size",
        "dim",
        "ndimension",
        "numel",
        "nelement",
        "element_size",
        "is_floating_point",
        "is_complex",
        "get_device",
        "is_contiguous",
    }
)
_FOLDED_FUNCTIONS = frozenset({torch.numel, torch.is_floating_point, torch.is_complex})
# Arguments fx's ``Tracer.create_arg`` hands back as they are (none is a tensor, module, named
# tuple or registered opaque type: torch registers ``Enum``, and only these exact types are
# matched, so an ``IntEnum`` takes fx's path): its chain of type tests skipped for them.
_PLAIN_ARGS = frozenset({int, float, bool, str, type(None)})


def is_leaf(module: nn.Module) -> bool:
    """Standard torch.nn modules with a lowering, or without children, are not traced into.
    A parametrized one (``torch.nn.utils.parametrize``: weight_norm, spectral_norm) is: its
    ``weight`` is computed from the original parameters by the parametrization, part of the
    forward, so the gradient reaches the originals. So is one with forward (pre-)hooks: as
    one node its hooks would never run (legacy weight_norm is a pre-hook; HF's output capture
    adds hooks). So is one whose ``forward`` the user set on the instance (a bare
    ``nn.Module()`` given a ``forward``): that forward is user code."""
    if not type(module).__module__.startswith("torch.nn") or is_parametrized(module):
        return False
    if module._forward_hooks or module._forward_pre_hooks or "forward" in vars(module):
        return False
    return lookup(type(module)) is not None or not any(True for _ in module.children())


@dataclass
class Captured:
    """A traced model: the graph module (root's parameters shared, not copied), the issues
    found while tracing, and (once `check_captured` ran) every issue including unsupported
    targets."""

    gm: fx.GraphModule
    issues: list[Issue] = field(default_factory=list)
    checked: list[Issue] | None = None
    example_inputs: tuple = ()
    out_spec: Any = None  # the pytree structure forward returns (`calls.flat_outputs`)
    binding: Binding = POSITIONAL  # how the example inputs reached forward
    # forward may read Python state outside the model (`outside_state`): `check` traces again
    outside_state: bool = True


def _value(arg: Any) -> Any:
    return fx.node.map_arg(arg, lambda n: n.meta["example_value"])


# how the note added to an error of the model's own code at capture begins
EXAMPLE_NOTE = "popxl_fx: while running"


def _copy(x: Any) -> Any:
    if not isinstance(x, torch.Tensor):
        return x
    return x.detach().clone().requires_grad_(x.requires_grad)  # folded: ``x.requires_grad``


class CaptureTracer(StaticChecks, RootCalls, fx.Tracer):
    """The tracer behind `capture` (see the module docstring); ``binding`` says how the
    example inputs reach the root's ``forward`` (`calls.Binding`)."""

    def __init__(
        self,
        root: nn.Module,
        example_inputs: Sequence[Any],
        leaf: Callable[[nn.Module], bool] = is_leaf,
        replay: Replay | None = None,
        binding: Binding = POSITIONAL,
        keep_state: bool = True,
    ) -> None:
        super().__init__()  # shapes fold in CaptureProxy (also for parameters)
        self.binding = binding
        # node.stack_trace (for users of the captured graph) comes from `user_stack`, which
        # reads only the user's frames; a replay trace is only compared and keeps none
        self.record_stack_traces = False
        self.proxy_buffer_attributes = True
        self.root_module = root
        # copies: computing the example values runs forward's in-place ops (``x += 1``)
        self._inputs = [_copy(x) for x in example_inputs]
        self.example_inputs = tuple(example_inputs)
        self._leaf = leaf
        self._paths: list[str] = []
        self._evaluating = False
        self.issues: list[Issue] = []
        # `capture_effects`: (module, attribute, issue) of the flags forward set once
        self.first_call_flags: list[tuple[nn.Module, str, Issue]] = []
        self._replay = replay  # a first trace whose example values this one may reuse
        # what a replay compares leaf modules by: only kept for a model traced again
        self._keep_state = keep_state

    # hierarchy --------------------------------------------------------------------------
    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return self._leaf(m)

    def call_module(self, m: nn.Module, forward: Callable, args: tuple, kwargs: dict) -> Any:
        if self._evaluating:  # computing an example value: plain eager call
            return forward(*args, **kwargs)
        path = self.installed_path(m)
        if path is None:  # made during forward: traced through (`capture_calls`)
            return self.adopt(m, forward, args, kwargs)
        self._paths.append(path)
        try:
            through = trace_through(m, args, kwargs)  # a front end's rule (`capture_watch`)
            if through is not None:
                return through(forward, *args, **kwargs)
            return super().call_module(m, forward, args, kwargs)
        finally:
            self._paths.pop()

    def getattr(self, attr: str, attr_val: Any, parameter_proxy_cache: dict) -> Any:
        if self._evaluating:
            return attr_val
        return super().getattr(attr, attr_val, parameter_proxy_cache)

    # values ------------------------------------------------------------------------------
    def proxy(self, node: fx.Node) -> fx.Proxy:
        return CaptureProxy(node, self)

    def create_arg(self, a: Any) -> Any:
        kind = type(a)  # the common arguments first: what fx makes of them, without its tests
        if kind is CaptureProxy:
            return a.node
        if kind in _PLAIN_ARGS:
            return a
        # a plain tensor a traced call wrote or drew into reads as its node (`capture_writes`)
        written = written_node(self, a) if isinstance(a, torch.Tensor) else None
        return written if written is not None else super().create_arg(a)

    def create_proxy(
        self,
        kind: str,
        target: Any,
        args: tuple,
        kwargs: dict,
        name=None,
        type_expr=None,
        proxy_factory_fn=None,
    ) -> Any:
        if kind in ("call_function", "call_method"):
            args, kwargs = call_args(self, args, kwargs)
        if self._folds(kind, target, args):
            return self._fold(kind, target, args, kwargs)
        if kind == "call_function" and target is operator.getitem and len(args) == 2:
            args = (args[0], static_index(args[1]))
        proxy = super().create_proxy(kind, target, args, kwargs, name, type_expr, proxy_factory_fn)
        note_write(self, proxy, args, kwargs)  # a plain tensor written into: followed
        return proxy

    def create_node(
        self, kind: str, target: Any, args: tuple, kwargs: dict, name=None, type_expr=None
    ) -> fx.Node:
        # Every node passes here, also the get_attr nodes fx makes for tensor constants.
        node = super().create_node(kind, target, args, kwargs, name, type_expr)
        if kind != "output":
            self._annotate(node)
            notify(node, self.root_module)
        return node

    @staticmethod
    def _folds(kind: str, target: Any, args: tuple) -> bool:
        return (
            (
                (kind == "call_method" and target in _FOLDED_METHODS)
                or (kind == "call_function" and target in _FOLDED_FUNCTIONS)
            )
            and bool(args)
            and isinstance(args[0], fx.Proxy)
        )

    def _fold(self, kind: str, target: Any, args: tuple, kwargs: dict) -> Any:
        self_value = args[0].node.meta["example_value"]
        rest = _value(self.create_arg((args[1:], kwargs)))
        if kind == "call_method":
            return getattr(self_value, target)(*rest[0], **rest[1])
        return target(self_value, *rest[0], **rest[1])

    def _annotate(self, node: fx.Node) -> None:
        node.meta["module_path"] = self._paths[-1] if self._paths else ""
        if self._replay is None:
            node.meta["source"], stack = user_stack(*(self.stack_outside or ()))
            if stack:
                node.stack_trace = stack
        else:  # a replay keeps no stack trace: the same source line without formatting one
            node.meta["source"] = user_frame()
        node.meta["example_value"] = self._evaluate(node)
        if node.op == "placeholder":
            return
        if node.op == "call_module" and self._replay is None and self._keep_state:
            node.meta["module_state"] = module_state(self.root_module.get_submodule(node.target))
        self.mark_data_dependent(node)

    def _evaluate(self, node: fx.Node) -> Any:
        value = self._evaluated(node)
        # a tensor forward made (``torch.ones(n)``) is new in each eager call: a copy, so
        # that an in-place update on the example inputs leaves the graph's constant as made
        if node.op == "get_attr" and str(node.target).startswith("_tensor_constant"):
            return value.clone()
        return value

    def _evaluated(self, node: fx.Node) -> Any:
        if self._replay is None:
            return self._compute(node)
        value = self._replay.reuse(node, self.root_module)
        if value is MISSING:
            value = self._compute(node)
            if node.op in ("placeholder", "get_attr"):
                self._replay.settle(node, value)
        return value

    def _compute(self, node: fx.Node) -> Any:
        if node.op == "placeholder":
            return self._next_input(node)
        args, kwargs = _value((node.args, node.kwargs))
        self._evaluating = True  # plain attribute reads and module calls while computing
        try:
            return self._call(node, args, kwargs)
        except Exception as exc:  # the example inputs do not fit the model: say where
            exc.add_note(
                f"{EXAMPLE_NOTE} {self._where(node)} on the example inputs "
                f"(from {node.meta.get('source', '<unknown>')})"
            )
            raise
        finally:
            self._evaluating = False

    def _where(self, node: fx.Node) -> str:
        if node.op == "call_module":
            module = self.root_module.get_submodule(node.target)
            return f"{type(module).__name__} module '{node.target}'"
        path = node.meta.get("module_path", "")
        return f"{describe(node)} in " + (f"module '{path}'" if path else "the root module")

    def _call(self, node: fx.Node, args: tuple, kwargs: dict) -> Any:
        if node.op == "get_attr":
            value = _fetch(self.root_module, node.target)
            if is_made_constant(node):  # ``torch.zeros(...)`` folded: forward may update it
                return value.clone()
            return value
        # torch.no_grad()'s own two calls, without its context-manager objects (once a node)
        grad = torch.is_grad_enabled()
        torch._C._set_grad_enabled(False)
        try:
            if node.op == "call_module":
                return self.root_module.get_submodule(node.target)(*args, **kwargs)
            if node.op == "call_method":
                return getattr(args[0], node.target)(*args[1:], **kwargs)
            return node.target(*args, **kwargs)
        finally:
            torch._C._set_grad_enabled(grad)

    def _next_input(self, node: fx.Node) -> Any:
        if self._inputs:
            return self._inputs.pop(0)
        if node.args:  # a parameter with a default value
            return node.args[0]
        raise TypeError(f"forward() argument '{node.target}' has no example input.")


def _fetch(root: nn.Module, target: str) -> Any:
    value: Any = root
    for part in target.split("."):
        value = getattr(value, part)
    return value


def capture(
    model: nn.Module, example_inputs: Sequence[Any], binding: Binding = POSITIONAL
) -> Captured:
    """Trace ``model`` on ``example_inputs`` (see the module docstring), passed to its
    ``forward`` as ``binding`` says.

    The model's buffers and the torch RNG are restored afterwards, so capture has no effect
    on the model even in train mode (batch-norm statistics, dropout).
    """
    outside = reads_outside_state(model, example_inputs)  # before forward runs
    tracer = CaptureTracer(model, example_inputs, binding=binding, keep_state=outside)
    gm = trace_module(tracer, model)
    settle_first_call_flags(tracer, gm, model)
    inputs = tuple(example_inputs)
    return Captured(gm, tracer.issues, None, inputs, tracer.out_spec, binding, outside)


def settle_first_call_flags(tracer: CaptureTracer, gm: fx.GraphModule, model: nn.Module) -> None:
    """Flags ``forward`` set on its first call (`capture_effects`) are lazy set-up when a
    second trace, with them set, runs the same ops; otherwise they are per-call state:
    reported, and taken off the model again."""
    flags = tracer.first_call_flags
    if not flags or _same_ops_once_set(tracer, gm, model):
        return
    for module, name, issue in flags:
        module.__dict__.pop(name, None)
        tracer.issues.append(issue)


def _same_ops_once_set(first: CaptureTracer, gm: fx.GraphModule, model: nn.Module) -> bool:
    replay = Replay(gm.graph)
    tracer = CaptureTracer(model, first.example_inputs, replay=replay, binding=first.binding)
    try:
        second = trace_graph(tracer, model)
    except Exception:  # the second call fails: not the same program
        return False
    ops = lambda g: [(n.op, n.target) for n in g.nodes]
    return ops(gm.graph) == ops(second)
