"""Python effects of ``forward`` that a static program cannot repeat, found while tracing.

A PopXL program is the forward's *tensor* work; its Python runs once, at capture. So:
- ``print(x)`` of a tensor prints once (the example's values), not on each step: reported as
  "print of a tensor" (the entry points warn); any other ``print`` by forward's own code
  prints once too, at capture, and is reported as "print in forward" (a warning as well);
- Python state changed by ``forward`` (``self.calls += 1``, ``self.history.append(h)``,
  ``self.cache[k] = v``) changes once, at capture: reported as "Python state in forward"
  (the entry points raise), and undone after the trace so capture leaves the model as it was;
  except a flag set once (a bool on an attribute the module did not have, such as HF's
  ``_output_capturing_hooks_installed``): that is lazy set-up, which eager's first call does
  as well and later calls skip, so it stays set after the trace and is not per-step state
  when a second trace, with the flag set, runs the same ops (`capture` checks that);
- numpy on a tensor (``x.numpy()``, ``np.tanh(x)``) computes once, on the example values, and
  its result would be frozen into the program: reported by `capture._Proxy` as "numpy on a
  tensor" (see `numpy_issue`).
Each issue carries the user's ``file:line``.
"""

from __future__ import annotations

import builtins
import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch import nn

from .errors import Issue, _internal_file, user_frame
from .inplace import updates_in_place

__all__ = ["PRINT", "PRINT_TEXT", "STATE", "NUMPY", "WARN_KINDS", "python_effects_recorded"]

PRINT = "print of a tensor"
PRINT_TEXT = "print in forward"
STATE = "Python state in forward"
NUMPY = "numpy on a tensor"
# the entry points warn about these and raise for the rest
WARN_KINDS = frozenset({PRINT, PRINT_TEXT})

_PRINT_HINT = (
    "the program runs forward's Python once, at capture: this printed the example's values "
    "once and prints nothing on later steps; print the returned outputs, or use "
    "popxl_core.ops.print_tensor in a hand-written program."
)
_PRINT_TEXT_HINT = (
    "the program runs forward's Python at capture only: this printed then and prints "
    "nothing on the steps; print outside forward (around the trainer's call)."
)
_STATE_HINT = (
    "the program runs forward's Python once, at capture, so this changes once and not on each "
    "step (and eager would change it on every call); keep per-step state in a registered "
    "buffer updated with tensor ops, or change it outside forward."
)


def _user_caller(depth: int = 2) -> bool:
    """The code calling the patched function is the user's (not torch's or popxl_fx's)."""
    return not _internal_file(sys._getframe(depth).f_code.co_filename)


def _proxies(args: Any) -> list[fx.Proxy]:
    return [a for a in pytree.tree_leaves(args) if isinstance(a, fx.Proxy)]


def _plain_value(value: Any) -> Any:
    return value.node.meta.get("example_value") if isinstance(value, fx.Proxy) else value


def _printing(tracer, original):
    def print_(*args: Any, **kwargs: Any) -> None:
        proxies = _proxies(args)
        formatted = any(isinstance(a, str) and "Proxy(" in a for a in args)
        if (proxies or formatted) and not getattr(tracer, "_evaluating", False):
            node = proxies[0].node if proxies else None
            what = f"print() of {node.name}" if node is not None else "print() of a tensor"
            tracer.record(node, PRINT, what, _PRINT_HINT)
            args = tuple(pytree.tree_map(_plain_value, list(args)))
        elif not getattr(tracer, "_evaluating", False) and _user_caller():
            tracer.record(None, PRINT_TEXT, "print() in forward", _PRINT_TEXT_HINT)
        original(*args, **kwargs)

    return print_


# torch.distributions gives a Python scalar the dtype of the tensors beside it, found with
# isinstance (`broadcast_all`): seeing a proxy there, it would make the scalar float32 and
# a half distribution's samples float. It sees the example's type, as user code does.
_TYPED_LIBRARIES = (os.path.join("torch", "distributions", ""),)


def _typed_caller(depth: int = 2) -> bool:
    """The code calling ``isinstance`` is the user's, or a library in `_TYPED_LIBRARIES`."""
    filename = sys._getframe(depth).f_code.co_filename
    return not _internal_file(filename) or any(lib in filename for lib in _TYPED_LIBRARIES)


def _typed_as_example(original):
    """``isinstance`` for forward's own code: a traced value has its example value's type
    (``isinstance(x, torch.Tensor)`` holds for a traced tensor, as in eager); torch's and
    popxl_fx's code still see proxies, but for `_TYPED_LIBRARIES`."""

    def isinstance_(obj: Any, classinfo: Any) -> bool:
        if original(obj, fx.Proxy) and _typed_caller():
            value = obj.node.meta.get("example_value", obj)
            if not original(value, fx.Proxy):
                return original(value, classinfo)
        return original(obj, classinfo)

    return isinstance_


# The internal modules whose ``isinstance`` calls are nearly all of a trace's (fx's tracer,
# graph and proxies, pytree, parameters): ~8,000 calls in a 100-node trace, each through the
# Python `_typed_as_example` wrapper. `_typed_caller` is False for every one of them (their
# code is internal and not in `_TYPED_LIBRARIES`), so the wrapper answers as the builtin does:
# a module-level ``isinstance`` bound to the builtin in these modules' globals, for the trace,
# gives the same answers without the wrapper.
_PLAIN_ISINSTANCE_MODULES = (
    "torch.fx._symbolic_trace",
    "torch.fx.graph",
    "torch.fx.node",
    "torch.fx.proxy",
    "torch._library.opaque_object",
    "torch.utils._pytree",
    "torch.nn.parameter",
    "torch.nn.modules.module",
    "copy",
    "traceback",
    "popxl_fx.capture",
)


@contextlib.contextmanager
def _plain_isinstance(original: Any) -> Iterator[None]:
    """The builtin ``isinstance`` in `_PLAIN_ISINSTANCE_MODULES`' globals while tracing (each
    checked internal; a module with its own ``isinstance``, or a nested trace's, is left)."""
    bound = []
    for name in _PLAIN_ISINSTANCE_MODULES:
        module = sys.modules.get(name)
        if module is None or "isinstance" in vars(module) or _typed_file(module.__file__):
            continue
        vars(module)["isinstance"] = original
        bound.append(module)
    try:
        yield
    finally:
        for module in bound:
            del vars(module)["isinstance"]


def _typed_file(filename: str | None) -> bool:
    """Whether ``isinstance`` called from code in ``filename`` sees example types."""
    return (
        not filename
        or not _internal_file(filename)
        or any(lib in filename for lib in _TYPED_LIBRARIES)
    )


def _same(old: Any, new: Any) -> bool:
    if old is new:
        return True
    if type(old) is type(new) and isinstance(old, (bool, int, float, str, bytes, tuple)):
        try:
            return bool(old == new)
        except Exception:  # a tuple holding tensors: not comparable, so changed
            return False
    return False


def _updated_buffer(module: nn.Module, name: str, value: Any) -> bool:
    """Whether ``value`` is the buffer ``name`` itself, updated in place: eager's
    ``self.buf += 1`` sets the attribute to the tensor it holds already (a no-op)."""
    if not isinstance(value, fx.Proxy) or name not in module._buffers:
        return False
    node = value.node
    while updates_in_place(node):
        node = node.args[0]
    return node.op == "get_attr" and node.meta.get("example_value") is module._buffers[name]


def _setting(tracer, modules: set[int], flags: set, original):
    def setattr_(module: nn.Module, name: str, value: Any) -> None:
        if _updated_buffer(module, name, value):
            return  # the lowering writes the update back into the buffer
        if (
            isinstance(value, fx.Proxy)
            and module.__dict__.get("_buffers", {}).get(name) is not None
        ):
            _buffer_assigned(tracer, module, name, value)
            return  # the buffer stays registered; its in-place update is in the graph
        if (
            id(module) in modules
            and not getattr(tracer, "_evaluating", False)
            and not isinstance(value, (nn.Module, torch.Tensor))
            and not name.startswith("_tensor_constant")
            and _user_caller()
        ):
            old = module.__dict__.get(name, _MISSING)
            if old is _MISSING and isinstance(value, bool):
                flags.add((id(module), name))  # lazy set-up, done once: kept by `_restore`
                what = f"forward sets {type(module).__name__}.{name} = {value} on its first call"
                tracer.first_call_flags.append((module, name, _state_issue(tracer, module, what)))
            elif not _same(old, value):
                what = f"forward sets {type(module).__name__}.{name} = {type(value).__name__}"
                _record_state(tracer, module, what)
        original(module, name, value)

    return setattr_


_MISSING = object()

_BUFFER_HINT = (
    "This is not supported. Consider using self.{0}.copy_(src) to copy data from a source "
    "tensor, where src is the name of the source tensor."
)


def _buffer_assigned(tracer, module: nn.Module, name: str, value: fx.Proxy) -> None:
    """``self.buf = v`` in forward: fine when ``v`` is the buffer updated in place (what
    ``self.buf += x`` assigns); a state issue otherwise (eager would swap the tensor)."""
    node, buffer = value.node, module._buffers[name]
    while node.op == "call_function" and _is_inplace(node, tracer.root_module):
        node = node.args[0]
    if node.op == "get_attr" and _buffer(tracer.root_module, node.target) is buffer:
        return
    # PopTorch's words: a buffer is the program's variable, updated in place on each step
    what = f"Buffer {name} is reassigned within the model when calling the forward method."
    path = next((p for p, m in tracer.root_module.named_modules() if m is module), "")
    tracer._paths.append(path)
    try:
        tracer.record(None, STATE, what, _BUFFER_HINT.format(name))
    finally:
        tracer._paths.pop()


def _is_inplace(node: fx.Node, root: nn.Module) -> bool:
    from .inplace import mutated_input

    return mutated_input(node, root) is not None


def _buffer(root: nn.Module, target: str) -> Any:
    """The buffer a get_attr node reads (from the dict: the trace patches attribute reads)."""
    owner, _, name = target.rpartition(".")
    return root.get_submodule(owner)._buffers.get(name)


def _state_issue(tracer, module: nn.Module, what: str) -> Issue:
    """The issue `_record_state` would record, not recorded: `capture` keeps it for a flag
    set once, and reports it only if forward then runs differently."""
    path = next((p for p, m in tracer.root_module.named_modules() if m is module), "")
    hint = (
        "forward takes another path once the flag is set, so its first call is not the one "
        "the program should repeat; set the flag outside forward (or before the first call)."
    )
    return Issue(STATE, what, user_frame(), path, "", hint)


def _record_state(tracer, module: nn.Module, what: str) -> None:
    path = next((p for p, m in tracer.root_module.named_modules() if m is module), "")
    tracer._paths.append(path)  # the issue names the module whose attribute changed
    try:
        tracer.record(None, STATE, what, _STATE_HINT)
    finally:
        tracer._paths.pop()


def _recording(kind: type, mutators: tuple[str, ...]) -> type:
    """A subclass of list/dict/set whose mutating methods report the mutation first."""

    def wrap(name: str):
        base = getattr(kind, name)

        def method(self, *args: Any, **kwargs: Any) -> Any:
            if _user_caller():
                _record_state(
                    self._tracer,
                    self._module,
                    f"forward mutates {type(self._module).__name__}.{self._attr} "
                    f"({kind.__name__}.{name})",
                )
            return base(self, *args, **kwargs)

        return method

    return type(f"_Recording{kind.__name__}", (kind,), {m: wrap(m) for m in mutators})


_LIST_OPS = ("append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse")
_RECORDING: dict[type, type] = {
    list: _recording(list, (*_LIST_OPS, "__setitem__", "__delitem__", "__iadd__")),
    dict: _recording(
        dict, ("__setitem__", "__delitem__", "pop", "popitem", "update", "setdefault", "clear")
    ),
    set: _recording(set, ("add", "discard", "remove", "update", "clear", "pop")),
}


def _user_modules(model: nn.Module) -> list[nn.Module]:
    """The modules whose forward is user code (torch.nn's own manage their own state)."""
    return [m for m in model.modules() if not type(m).__module__.startswith("torch.")]


_MODULE_INTERNALS = frozenset(vars(nn.Module()))  # _parameters, _modules, hooks, ...


def _swap_containers(tracer, modules: list[nn.Module]) -> None:
    """Put recording copies of the modules' own list/dict/set attributes in place (the
    originals, untouched by the trace, come back in `_restore`)."""
    for m in modules:
        for name, value in list(vars(m).items()):
            recording = _RECORDING.get(type(value))
            if recording is None or name in _MODULE_INTERNALS:
                continue
            copy = recording(value)
            copy._tracer, copy._module, copy._attr = tracer, m, name
            m.__dict__[name] = copy


def _plain_state(modules: list[nn.Module]) -> dict:
    """Every module's non-tensor, non-module attributes, to put back after the trace."""
    return {
        id(m): (m, {k: v for k, v in vars(m).items() if not isinstance(v, torch.Tensor)})
        for m in modules
    }


def _restore(state: dict, flags: set) -> None:
    """Put back the attributes `_plain_state` saved (the original containers among them) and
    drop plain attributes the forward added, except the set-up ``flags`` (module id, name)."""
    for m, attrs in state.values():
        for name in [k for k in vars(m) if k not in attrs and (id(m), k) not in flags]:
            if not isinstance(m.__dict__[name], (torch.Tensor, nn.Module)):
                del m.__dict__[name]
        m.__dict__.update(attrs)


@contextlib.contextmanager
def python_effects_recorded(tracer, model: nn.Module) -> Iterator[None]:
    """While ``tracer`` traces ``model``: report prints of tensors and Python state that
    forward changes (see the module docstring); put the model's Python state back after."""
    modules = _user_modules(model)
    state = _plain_state(modules)
    _swap_containers(tracer, modules)
    ids = {id(m) for m in model.modules()}
    original_print, original_isinstance = builtins.print, builtins.isinstance
    builtins.print = _printing(tracer, original_print)
    builtins.isinstance = _typed_as_example(original_isinstance)
    owners = _setattr_owners(model)
    saved = {cls: vars(cls).get("__setattr__", _MISSING) for cls in owners}
    flags: set = set()
    setting = _setting(tracer, ids, flags, nn.Module.__setattr__)
    # the model's classes record attribute writes during the trace (restored below): a
    # patch of their method the type checker refuses
    for cls in owners:
        cls.__setattr__ = setting  # type: ignore[method-assign]
    try:
        with _plain_isinstance(original_isinstance):
            yield
    finally:
        builtins.print, builtins.isinstance = original_print, original_isinstance
        for cls, old in saved.items():
            if old is _MISSING:
                del cls.__setattr__
            else:
                cls.__setattr__ = old  # type: ignore[method-assign]  # restored
        # a replay trace (a second one, only compared) leaves the model as the first left it
        _restore(state, flags if getattr(tracer, "_replay", None) is None else set())


def _setattr_owners(model: nn.Module) -> list[type]:
    """The classes whose ``__setattr__`` the trace replaces: the model's module classes, when
    each inherits ``nn.Module``'s (a class's own entry replaced, then deleted), else
    ``nn.Module`` itself (``nn.RNNBase`` defines one that calls it through ``super()``).
    Assigning a dunder on a class updates the slots of all its subclasses: on ``nn.Module``,
    hundreds once torchvision is imported, that took ~0.15 ms per assignment, two per trace;
    on the model's classes next to nothing."""
    classes = list(dict.fromkeys(type(m) for m in model.modules()))
    if any(
        cls is nn.Module
        or "__setattr__" in vars(cls)
        or cls.__setattr__ is not nn.Module.__setattr__
        for cls in classes
    ):
        return [nn.Module]
    return classes
