"""Whether a model's Python can read state from outside the model: `reads_outside_state`.

`check` traces a model a second time to see shapes that change between calls. Inside the
model, what forward changes is already found by the first trace (`capture_effects`: module
attributes, their lists/dicts/sets, leaf-module configuration, replaced parameters; each a
"Python state in forward" issue) and put back before the second trace starts. So a second
trace can only differ when forward's Python reads something that lives outside the model and
the first call changed (``next(_COUNTER)`` on a module-level iterator, a global list, a
closure's cell, ``random``, ``time``), or an object the model holds that the first trace does
not watch (an iterator or a config object kept as an attribute).

The scan is static and conservative: it follows the code that the model's own classes, the
functions they reach through globals and closures, and the hooks can run, and answers False
only when every global and closure value they read is a constant, a tensor, a module, a
trusted library (torch and pure standard modules), or user code that passes the same scan.
Anything it cannot prove (an unknown object, a write to a global, a cell or another object's
attribute, too much code) answers True, and `check` traces again.
"""

from __future__ import annotations

import builtins
import collections
import dis
import enum
import functools
import sys
import types
import weakref
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import nn

from .errors import _internal_file

__all__ = ["reads_outside_state"]

# modules whose attributes hold no state a forward's shapes could read
_PURE_MODULES = frozenset(
    {
        "torch",
        "math",
        "cmath",
        "operator",
        "functools",
        "itertools",
        "collections",
        "typing",
        "numbers",
        "enum",
        "dataclasses",
        "abc",
        "contextlib",
        "warnings",
        "builtins",
        "string",
        "copy",
    }
)
# builtins that read the world or the interpreter's state
_IMPURE_BUILTINS = frozenset(
    {"open", "input", "exec", "eval", "compile", "globals", "__import__", "breakpoint"}
)
_WRITES = frozenset({"STORE_GLOBAL", "DELETE_GLOBAL"})
_Pair = collections.namedtuple("_Pair", "a")
_CONSTANTS = (
    type(None),
    bool,
    int,
    float,
    complex,
    str,
    bytes,
    slice,
    range,
    type(Ellipsis),
    torch.dtype,
    torch.device,
    torch.layout,
    torch.memory_format,
    enum.Enum,
    type(_Pair.a),  # a namedtuple's field: reads its tuple
)
# a user module's own are swapped for recording copies at capture; torch's modules' own
# (a GraphModule's line table) only torch's code uses
_HELD = (list, dict, set)
_MODULE_INTERNALS = frozenset(vars(nn.Module()))  # _parameters, _modules, hooks, ...
_OWN_TENSORS_AND_CHILDREN = frozenset({"_parameters", "_buffers", "_modules"})
# the plain values most attributes of a module are
_TRIVIAL = frozenset({type(None), bool, int, float, str, torch.dtype, torch.device})
_NAMEDTUPLE = frozenset({"_field_defaults", "_fields"})
_LIMIT = 3000  # code objects scanned before the answer is "cannot tell"
_MISSING = object()


class _TooMuch(Exception):
    pass


def reads_outside_state(model: nn.Module, example_inputs: Any = ()) -> bool:
    """True unless the model's Python provably reads only the model and constants (see the
    module docstring); ``example_inputs`` must be tensors and constants too (the second trace
    is given the same objects)."""
    scan = _Scan()
    try:
        hooks = _global_hooks()
        leaves = pytree.tree_leaves(example_inputs)  # the trace copies the tensors
        closed = all(isinstance(x, torch.Tensor) or scan.value(x) for x in leaves)
        closed = closed and all(scan.value(h) for h in hooks)
        return not (closed and all(scan.module(m) for m in model.modules()))
    except _TooMuch:
        return True


def _global_hooks() -> list[Any]:
    """The hooks registered for every module (``register_module_forward_hook``)."""
    mod = sys.modules["torch.nn.modules.module"]
    names = ("_global_forward_hooks", "_global_forward_pre_hooks")
    return [h for name in names for h in getattr(mod, name, {}).values()]


def _trusted_module(name: str) -> bool:
    return name.split(".")[0] in _PURE_MODULES


def _internal_class(cls: type) -> bool:
    """A class of torch or of a pure standard module: its code is not scanned."""
    module = sys.modules.get(cls.__module__)
    filename = getattr(module, "__file__", None) or "<builtin>"
    return _internal_file(filename) and _trusted_module(cls.__module__)


class _Scan:
    """One scan; each code object, function and class is looked at once."""

    def __init__(self) -> None:
        self.seen: set[int] = set()

    def _first(self, thing: Any) -> bool:
        if id(thing) in self.seen:
            return False
        self.seen.add(id(thing))
        if len(self.seen) > _LIMIT:
            raise _TooMuch
        return True

    def module(self, m: nn.Module) -> bool:
        """Its class's code, and every attribute it holds besides parameters, buffers and
        children (hooks, an instance ``forward``, plain values)."""
        if not self._first(m):
            return True
        deep = type(m).__module__.startswith("torch.")
        return self.cls(type(m)) and all(
            self._attribute(name, v, deep) for name, v in vars(m).items()
        )

    def _attribute(self, name: str, v: Any, deep: bool) -> bool:
        """A module's attribute. Its tensors the trace restores and reports when changed
        (`capture_state.plain_tensors`), as it does a user module's own lists, dicts and sets
        (`capture_effects`: shallow copies, so what they hold is scanned as values); a torch
        module's containers (an RNN's weight lists) only torch's code uses; hook tables are
        read for the hooks in them."""
        if type(v) in _TRIVIAL or name in _OWN_TENSORS_AND_CHILDREN:
            return True  # most of a module's attributes: a quick answer
        if name in _MODULE_INTERNALS and isinstance(v, dict):
            v = list(v.values())
        if type(v) in _HELD and not v:
            return True
        return self._held(v, deep)

    def _held(self, v: Any, deep: bool) -> bool:
        if isinstance(v, torch.Tensor):
            return True
        if type(v) not in _HELD:
            return self.value(v)
        items = v.items() if isinstance(v, dict) else ((e,) for e in v)
        inner = (lambda e: self._held(e, True)) if deep else self.value
        return all(inner(e) for pair in items for e in pair)

    def value(self, v: Any) -> bool:
        """A value read by forward's Python (a global, a cell, an attribute) holds no state
        that can change between calls, and the code it may run is closed too."""
        if isinstance(v, _CONSTANTS):
            return True
        if isinstance(v, (tuple, frozenset)):
            return all(self.value(e) for e in v)
        if isinstance(v, nn.Module):
            return self.module(v)
        if isinstance(v, (torch.Tensor, list, dict, set)):
            return False  # mutable, and nobody watches it
        if isinstance(v, weakref.ref):  # an RNN's references to its own weights
            return isinstance(v(), (torch.Tensor, type(None)))
        return self._callable(v)

    def _callable(self, v: Any) -> bool:
        if isinstance(v, types.ModuleType):
            return _trusted_module(v.__name__)
        if isinstance(v, type):
            return self.cls(v)
        if isinstance(v, types.FunctionType):
            return self.function(v)
        if isinstance(v, (types.MethodType, types.BuiltinMethodType)):
            owner = v.__self__
            func = getattr(v, "__func__", None)
            return self.value(owner) and (func is None or self.function(func))
        if isinstance(v, functools.partial):
            return all(self.value(e) for e in (v.func, *v.args, *v.keywords.values()))
        if isinstance(v, (staticmethod, classmethod)):
            return self.value(v.__func__)
        if isinstance(v, property):
            return all(self.value(f) for f in (v.fget, v.fset, v.fdel) if f is not None)
        # torch's own objects (op overloads) and popxl_fx's (a compiled forward, a binding)
        return type(v).__module__.split(".")[0] in ("torch", "popxl_fx")

    def cls(self, c: type) -> bool:
        """A class: trusted, or each of its attributes and bases closed."""
        if _internal_class(c) or not self._first(c):
            return True
        attrs = [
            v
            for k, v in vars(c).items()
            if (not (k.startswith("__") and k.endswith("__")) or callable(v))
            and k not in _NAMEDTUPLE  # made by collections, read by nothing of forward's
        ]
        attrs = [v for v in attrs if not isinstance(v, types.MemberDescriptorType)]
        return all(self.value(v) for v in attrs) and all(self.cls(b) for b in c.__mro__[1:])

    def function(self, f: types.FunctionType) -> bool:
        """A function: trusted (torch's, the standard library's), or its code, globals and
        closure cells closed."""
        if _internal_file(f.__code__.co_filename) or not self._first(f):
            return True
        for cell in f.__closure__ or ():
            try:
                contents = cell.cell_contents
            except ValueError:  # an empty cell: nothing read yet
                continue
            if not self.value(contents):
                return False
        return self.code(f.__code__, f.__globals__)

    def code(self, co: types.CodeType, globals_: dict) -> bool:
        """A code object and the code objects nested in it (lambdas, comprehensions)."""
        if not self._first(co):
            return True
        reads = _global_reads(co)
        if reads is None:
            return False
        nested = [c for c in co.co_consts if isinstance(c, types.CodeType)]
        closed = all(self._global(globals_, name) for name in reads)
        return closed and all(self.code(c, globals_) for c in nested)

    def _global(self, globals_: dict, name: str) -> bool:
        value = globals_.get(name, _MISSING)
        if value is _MISSING:
            if name in _IMPURE_BUILTINS:
                return False
            value = vars(builtins).get(name, _MISSING)
        return value is not _MISSING and self.value(value)


@functools.lru_cache(maxsize=8192)
def _global_reads(co: types.CodeType) -> tuple[str, ...] | None:
    """The global names ``co`` reads (their values are looked at on each scan), or None when
    it writes a global, an enclosing function's variable or an attribute of anything but its
    first argument, or imports a module that is not trusted. A fact of the code alone: each
    code object is disassembled once per process."""
    instructions = list(dis.get_instructions(co))
    names: dict[str, None] = {}
    for i, ins in enumerate(instructions):
        op = ins.opname
        if op in _WRITES or (op == "STORE_DEREF" and ins.argval in co.co_freevars):
            return None
        if op in ("STORE_ATTR", "DELETE_ATTR") and not _on_self(co, instructions, i):
            return None
        if op == "IMPORT_NAME" and not _trusted_module(ins.argval):
            return None
        if op in ("LOAD_GLOBAL", "LOAD_NAME"):
            names[ins.argval] = None
    return tuple(names)


def _on_self(co: types.CodeType, instructions: list, i: int) -> bool:
    """An attribute write whose object is the first argument (``self.a.b = v``): a module,
    whose writes the trace watches, or an object the model holds (scanned as its value)."""
    j = i - 1
    while j >= 0 and instructions[j].opname == "LOAD_ATTR":
        j -= 1
    first = co.co_varnames[0] if co.co_argcount else None
    base = instructions[j] if j >= 0 else None
    return base is not None and base.opname == "LOAD_FAST" and base.argval == first
