"""The lowering table (fx target -> popxl ops) and the driver that lowers an fx graph with it.

Keys of `LOWERINGS` are what an fx node calls: torch functions (``torch.relu``, ``F.relu``),
``operator.*`` functions, method names as strings (``"view"`` for ``x.view(...)``), ATen
overload packets (``torch.ops.aten.addmm``; used by the decomposition fallback) and
``nn.Module`` classes (leaf modules). Entries live in ``popxl_fx/lowerings/``.

A function/method/operator lowering is ``fn(ctx, *args, **kwargs)``; a leaf-module lowering is
``fn(ctx, module, *args, **kwargs)``. Args are the node's args with fx Nodes replaced by popxl
Tensors (python values, including values folded from shapes, stay python values).
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import torch
import torch.fx as fx

import popxl_core as popxl
from popxl_core import ops
from popxl_core.context import module_origin

from .errors import Issue, UnsupportedError
from .inplace import is_made_constant, mutated_input
from .out_kwarg import into_out, out_target, without_out
from .view_writes import write_through

__all__ = [
    "Fallback",
    "LOWERINGS",
    "LoweringContext",
    "VariableOwner",
    "lookup",
    "lowers",
    "lowers_when_imported",
    "numpy_aliases",
    "run_graph",
    "target_name",
]

LOWERINGS: dict[Any, Callable] = {}
# lowerings of functions from optional packages, by (module, name): registered when a graph
# first calls the function (`_pending`), so `import popxl_fx` does not import the package
_PENDING: dict[tuple[str | None, str | None], Callable] = {}


def lowers(*targets: Any) -> Callable[[Callable], Callable]:
    """Register the decorated function as the lowering of every target in ``targets``."""
    if not targets:
        raise TypeError("lowers() needs at least one target.")

    def register(fn: Callable) -> Callable:
        for target in targets:
            if target in LOWERINGS and LOWERINGS[target] is not fn:
                old = LOWERINGS[target]
                raise ValueError(
                    f"{target_name(target)} already has a lowering "
                    f"({old.__module__}.{old.__qualname__}); declare it once."
                )
            LOWERINGS[target] = fn
        return fn

    return register


def lowers_when_imported(module: str, attribute: str) -> Callable[[Callable], Callable]:
    """Register the decorated function as the lowering of ``module.attribute`` when a graph
    first calls it: an optional package (torchvision) stays unimported until a model uses it."""

    def register(fn: Callable) -> Callable:
        _PENDING[(module, attribute)] = fn
        return fn

    return register


def _pending(target: Any) -> Callable | None:
    """The pending lowering of a function from an optional package, registered on first use.

    Matched by the function's module and name, not by fetching the attribute at import time:
    while torch.fx traces, the module's global is its patched wrapper, not the node's target.
    """
    key = (getattr(target, "__module__", None), getattr(target, "__name__", None))
    fn = _PENDING.get(key)
    if fn is not None:
        lowers(target)(fn)
    return fn


def lookup(target: Any) -> Callable | None:
    """The lowering of ``target``: exact key, then an ATen op's packet, then a class's bases."""
    fn = _get(target)
    if fn is None and callable(target) and _PENDING:
        fn = _pending(target)
    if fn is None and isinstance(target, torch._ops.OpOverload):
        fn = _get(target.overloadpacket)
    if fn is None and isinstance(target, type):
        fn = next((LOWERINGS[c] for c in target.__mro__[1:] if _get(c) is not None), None)
    return fn


def _get(target: Any) -> Callable | None:
    try:
        return LOWERINGS.get(target)
    except TypeError:  # unhashable targets have no lowering
        return None


_PUBLIC_MODULES = {
    "_operator": "operator",
    "torch._C._nn": "torch.nn.functional",
    "torch._C._VariableFunctions": "torch",
    "torch._C._fft": "torch.fft",
    "torch._C._linalg": "torch.linalg",
    "torch._C._special": "torch.special",
}


def target_name(target: Any) -> str:
    """A readable name for an fx target: 'torch.nn.functional.relu', 'Tensor.view', ..."""
    if isinstance(target, str):
        return f"Tensor.{target}"
    if isinstance(target, torch._ops.OpOverload):
        return f"aten.{target.__name__}"
    if isinstance(target, torch._ops.OpOverloadPacket):
        return f"aten.{target.__name__}"
    module: str = getattr(target, "__module__", None) or ""
    name = str(getattr(target, "__qualname__", None) or getattr(target, "__name__", repr(target)))
    if name.startswith("_VariableFunctionsClass."):  # torch.relu and friends
        module, name = "torch", name.split(".", 1)[1]
    if isinstance(target, type) and module.startswith("torch.nn.modules."):
        module = "torch.nn"
    for private, public in _PUBLIC_MODULES.items():
        if module == private:  # torch._C._fft.fft_rfft is torch.fft.rfft
            module, prefix = public, public.rsplit(".", 1)[-1] + "_"
            name = name[len(prefix) :] if public != "torch" and name.startswith(prefix) else name
    return f"{module}.{name}" if module else name


# What the driver calls for a node the table lacks: ``fallback(node, args, kwargs, ctx)``
# returns the node's popxl value(s) (`popxl_fx.fallback.lower_by_decomposition`). Passed in,
# not imported, so the table never imports the fallback that is built on it.
Fallback = Callable[[fx.Node, tuple, dict, "LoweringContext"], Any]


class VariableOwner(Protocol):
    """What the driver needs from the module being built (popxl_fx.Module implements it)."""

    torch_module: torch.nn.Module

    def variable(self, qualname: str) -> popxl.Tensor: ...

    def seed(self) -> popxl.Tensor: ...


class LoweringContext:
    """What a lowering may ask about the node it lowers.

    Attributes:
        training: ``training`` of the torch module being lowered (or the one that calls the
            function being lowered).
        module_path: qualified name of that module ('' at the root).
        node: the fx node being lowered.
    """

    def __init__(
        self, owner: VariableOwner, node: fx.Node, module_path: str, training: bool
    ) -> None:
        self.owner = owner
        self.node = node
        self.module_path = module_path
        self.training = training

    def _qualname(self, name: str) -> str:
        return f"{self.module_path}.{name}" if self.module_path else name

    def param(self, name: str) -> popxl.Tensor:
        """The variable of parameter ``<module_path>.<name>`` (one per torch tensor)."""
        return self.owner.variable(self._qualname(name))

    def buffer(self, name: str) -> popxl.Tensor:
        """The variable of buffer ``<module_path>.<name>``."""
        return self.owner.variable(self._qualname(name))

    def update_buffer(self, name: str, value: popxl.Tensor) -> None:
        """Write ``value`` into the buffer's variable in place (e.g. running statistics)."""
        buf = self.buffer(name)
        if value.dtype != buf.dtype:
            value = ops.cast(value, buf.dtype)
        ops.var_updates.copy_var_update_(buf, value)

    def seed(self) -> popxl.Tensor:
        """A fresh uint32 seed tensor (shape (2,)) for one random op."""
        return self.owner.seed()

    def expected(self) -> Any:
        """The node's output from shape propagation (torch tensor(s) of the right shape/dtype)."""
        return self.node.meta.get("example_value", self.node.meta.get("val"))


def run_graph(
    gm: fx.GraphModule,
    inputs: Sequence[Any],
    make_ctx: Callable[[fx.Node], LoweringContext],
    attr: Callable[[fx.GraphModule, str], Any],
    outlined: Callable[[fx.Node, tuple], Any] | None = None,
    path_prefix: str = "",
    fallback: Fallback | None = None,
    written: dict[int, Any] | None = None,
) -> Any:
    """Lower every node of ``gm`` in order; return the output pytree of popxl values.

    Args:
        inputs: values for the placeholders, in order.
        make_ctx: the context for a node.
        attr: resolves a get_attr target to a popxl value (variable or constant).
        fallback: lowers a node the table has no entry for (the driver passes
            `popxl_fx.fallback.lower_by_decomposition`); None: such a node is an error.
        outlined: lowers an outlined call site (a ``call_module`` node) with its tensor
            arguments, or returns ``NotImplemented`` for a node it does not outline.
        path_prefix: put before every op's module path (a block graph names its modules
            as ``"blocks.*.attn"``).
        written: filled with input position -> final value for each input that the graph
            updates in place (``x += 1``, ``x[i] = v``), for the caller to write back.
    """
    env: dict[fx.Node, Any] = {}
    feed: Iterator = iter(inputs)
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            env[node] = next(feed)
        elif node.op == "get_attr":  # a made constant updated in place: its new value
            env[node] = env.get(("updated", node.target)) or attr(gm, node.target)
        elif node.op == "output":
            if written is not None:
                written.update(_written_inputs(gm, inputs, env))
            return fx.node.map_arg(node.args[0], env.__getitem__)
        elif outlined is not None and node.op == "call_module" and _outline(node, env, outlined):
            continue
        else:
            _lower_call(node, env, make_ctx, path_prefix, fallback)
    raise ValueError("the fx graph has no output node.")


def _lower_call(node: fx.Node, env: dict, make_ctx, path_prefix: str, fallback) -> None:
    """Lower one call node into ``env``; an in-place update of an input is written back."""
    ctx = make_ctx(node)
    # every op made for this node names its torch module (reports, OOM errors)
    path = ".".join(p for p in (path_prefix, node.meta.get("module_path", "")) if p)
    with module_origin(path or "<root>"):
        env[node] = lower_node(node, env, ctx, fallback)
    mutated = mutated_input(node, ctx.owner.torch_module) or out_target(node)
    if mutated is not None:  # later users of the tensor (and of its bases) see the update
        env[node] = _same_dtype(env[node], env[mutated])
        relower = lambda n: lower_node(n, env, make_ctx(n), fallback)
        outer, value = write_through(mutated, env[node], env, relower)
        _write_back(outer, value, ctx)
        if is_made_constant(outer):  # fx reads it again through new get_attr nodes
            env[("updated", outer.target)] = value


def _same_dtype(value: Any, target: Any) -> Any:
    """An in-place update keeps its target's dtype (``half += float`` stays half)."""
    if isinstance(value, popxl.Tensor) and isinstance(target, popxl.Tensor):
        if value.dtype != target.dtype:
            return ops.cast(value, target.dtype)
    return value


def _written_inputs(gm: fx.GraphModule, inputs: Sequence[Any], env: dict) -> dict[int, Any]:
    """The final values of the inputs that the graph updated in place, by position."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    return {i: env[p] for i, p in enumerate(placeholders) if env[p] is not inputs[i]}


def _outline(node: fx.Node, env: dict, outlined: Callable[[fx.Node, tuple], Any]) -> bool:
    """Lower ``node`` as an outlined call site if ``outlined`` takes it; True if it did."""
    args = fx.node.map_arg(node.args, env.__getitem__)
    with module_origin(node.target):  # the call op names the module it runs
        out = outlined(node, args)
    if out is NotImplemented:
        return False
    env[node] = out
    return True


def _write_back(target: fx.Node, value: Any, ctx: LoweringContext) -> None:
    """An in-place update of a buffer (``self.count.add_(1)``) updates its variable too, so
    the next run starts from the new value, as the next eager call does."""
    if target.op != "get_attr" or not isinstance(value, popxl.Tensor):
        return
    if target.target not in dict(ctx.owner.torch_module.named_buffers()):
        return  # parameters and plain attributes: reported by `check` (hidden state)
    variable = ctx.owner.variable(target.target)
    if value.dtype != variable.dtype:
        value = ops.cast(value, variable.dtype)
    ops.var_updates.copy_var_update_(variable, value)


def lower_node(
    node: fx.Node, env: dict, ctx: LoweringContext, fallback: Fallback | None = None
) -> Any:
    """Lower one call node through the table, or ``fallback`` when it has no entry.

    An error raised by a lowering keeps its type and gains a note naming the fx node, its
    target, the module path and the user's source line.
    """
    args = fx.node.map_arg(node.args, env.__getitem__)
    kwargs = numpy_aliases(node, fx.node.map_arg(node.kwargs, env.__getitem__))
    try:
        if node.op == "call_module":
            module = ctx.owner.torch_module.get_submodule(node.target)
            fn = lookup(type(module))
            if fn is not None:
                return fn(ctx, module, *args, **kwargs)
        else:
            fn = lookup(node.target)
            if fn is not None:
                kwargs, out = without_out(node, kwargs, fn)
                return into_out(fn(ctx, *args, **kwargs), out)
    except UnsupportedError:
        raise
    except Exception as exc:
        exc.add_note(_where(node, ctx))
        raise
    if fallback is None:
        issue = unsupported(node, _what(node, ctx), hint="it has no lowering.")
        raise UnsupportedError(type(ctx.owner.torch_module).__name__, [issue])
    return fallback(node, args, kwargs, ctx)


# torch's argument parser takes numpy's keyword names for its own (``x.sum(axis=0)``,
# ``keepdims=True``); python-level torch functions and user code do not, so only builtins
_NUMPY_ALIASES = {"axis": "dim", "keepdims": "keepdim"}


def numpy_aliases(node: fx.Node, kwargs: dict) -> dict:
    """``kwargs`` with numpy's names renamed to torch's, for a call torch's parser reads."""
    if not any(k in _NUMPY_ALIASES for k in kwargs) or not _parsed_by_torch(node):
        return kwargs
    return {_NUMPY_ALIASES.get(k, k): v for k, v in kwargs.items()}


def _parsed_by_torch(node: fx.Node) -> bool:
    if node.op == "call_method":
        return True
    target = node.target
    return (
        node.op == "call_function"
        and isinstance(target, types.BuiltinFunctionType)
        and (str(getattr(target, "__module__", "")).startswith("torch"))
    )


def _what(node: fx.Node, ctx: LoweringContext) -> str:
    if node.op == "call_module":
        return target_name(type(ctx.owner.torch_module.get_submodule(node.target)))
    return target_name(node.target)


def _where(node: fx.Node, ctx: LoweringContext) -> str:
    what = _what(node, ctx)
    path = node.meta.get("module_path", "")
    where = f"module '{path}'" if path else "the root module"
    source = node.meta.get("source", "<unknown>")
    return f"while lowering {what} (fx node '{node.name}' in {where}) from {source}"


def unsupported(node: fx.Node, what: str, kind: str = "unsupported op", hint: str = "") -> Issue:
    """An `Issue` located at ``node`` (its user source line and module path)."""
    return Issue(
        kind,
        what,
        node.meta.get("source", "<unknown>"),
        node.meta.get("module_path", ""),
        node.name,
        hint,
    )
