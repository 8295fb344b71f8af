"""`addons.Module`: a popxl Module whose `build` declares its variables as named inputs.

`create_graph` traces `build` into a subgraph and returns the variable factories and the
graph with its named inputs. Submodules assigned as attributes are inlined when called;
`call_module` and `add_variable_inputs` outline them instead (the gradient side of a Module,
`call_module` and `build_grad`, is in module_grads.py).
"""

from __future__ import annotations

import functools
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import popxl_core
from popxl_core import Graph, Tensor, dtype, gcg
from popxl_core.transforms import GradGraphInfo

from ._grad_state import AuxStore, VarGradStore, mark_unsafe_to_autodiff
from .dot_tree import DotTree, check_key
from .graph import BoundGraph, GraphWithNamedArgs
from .graph_cache import GraphCache
from .module_grads import ModuleGrads, create_grad_graph_info
from .named_tensors import NamedTensors
from .variable_factory import (
    DataIter,
    NamedVariableFactories,
    VariableFactory,
    add_replica_sharded_variable_input,
    add_variable_input,
)

__all__ = [
    "BoundGraph",
    "GradGraphInfo",
    "GraphCache",
    "GraphWithNamedArgs",
    "Module",
    "NameScopeMeta",
    "NamedTensors",
    "NamedVariableFactories",
    "VariableFactory",
    "add_replica_sharded_variable_input",
    "add_variable_input",
    "create_grad_graph_info",
]

_GRAD_INLINING = ("error", "warning", "none")


def _scoped(build: Callable) -> Callable:
    @functools.wraps(build)
    def scoped_build(self, *args, **kwargs):
        scope = self.__dict__.get("_name_scope")
        # A subclass build calling super().build() must not nest the scope twice.
        if not scope or self.__dict__.get("_in_scope"):
            return build(self, *args, **kwargs)
        self.__dict__["_in_scope"] = True
        try:
            with popxl_core.name_scope(scope):
                return build(self, *args, **kwargs)
        finally:
            self.__dict__["_in_scope"] = False

    return scoped_build


class NameScopeMeta(type):
    """Wraps every `build` a class defines in ``popxl.name_scope(module._name_scope)``."""

    def __new__(mcs, name, bases, namespace, **kwargs):
        if callable(namespace.get("build")):
            namespace["build"] = _scoped(namespace["build"])
        return super().__new__(mcs, name, bases, namespace, **kwargs)


class Module(popxl_core.Module, ModuleGrads, metaclass=NameScopeMeta):
    """Base class of addons layers and models. Subclasses call ``super().__init__()``.

    Args:
        cache: True (or a GraphCache) reuses the graph when `create_graph` is called again
            with matching argument specs.
        grad_inlining_error: what to do when a module with `build_grad` is called inline
            (which skips the custom gradient): 'error', 'warning' or 'none'.
    """

    def __init__(
        self, cache: bool | GraphCache | None = False, grad_inlining_error: str = "error"
    ) -> None:
        if grad_inlining_error not in _GRAD_INLINING:
            raise ValueError(
                f"grad_inlining_error should be one of {_GRAD_INLINING}, got "
                f"{grad_inlining_error!r}."
            )
        self._variable_factories = NamedVariableFactories()
        self._named_inputs = NamedTensors()
        self._name_scope: str | None = None
        self._submodules: dict[str, Module] = {}
        self._called_graphs_grad_info: dict[Graph, GradGraphInfo] = {}
        self._cached_args: weakref.WeakKeyDictionary[Graph, tuple] = weakref.WeakKeyDictionary()
        self._list_len: int | None = None
        self.grad_inlining_error = grad_inlining_error
        self.aux = AuxStore()
        self.var_grad = VarGradStore()
        if cache and self.implements_grad_graph:
            raise ValueError(
                f"{type(self).__name__}: You cannot use graph caching if you have "
                "implemented `build_grad` (cache=True)."
            )
        self._graph_cache = (
            cache if isinstance(cache, GraphCache) else (GraphCache() if cache else None)
        )

    def __getattr__(self, name: str) -> Any:
        # only reached for a missing attribute: Module's own state missing means its
        # __init__ never ran
        if name.startswith("_") and "_variable_factories" not in self.__dict__:
            raise AttributeError(
                f"{type(self).__name__} has no attribute {name!r}: its __init__ did not call "
                "super().__init__(); call it first in __init__ (addons.Module keeps its "
                "variables and submodules there)."
            )
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # submodules ---------------------------------------------------------------------
    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, Module) and not name.startswith("_"):
            self._adopt(name, value)
        super().__setattr__(name, value)

    def _adopt(self, name: str, child: Module) -> None:
        """Nest ``child``'s factories and named inputs under ``name`` (shared trees)."""
        if "_variable_factories" not in self.__dict__:
            raise RuntimeError(
                f"{type(self).__name__}.__init__ must call super().__init__() "
                f"before assigning the submodule {name!r}."
            )
        child.set_name_scope(name)
        for mine, theirs in (
            (self._variable_factories, child._variable_factories),
            (self._named_inputs, child._named_inputs),
        ):
            if name in mine:
                mine.pop(name)
            mine.insert(name, theirs)
        self._submodules[name] = child

    def set_name_scope(self, name: str) -> None:
        self._name_scope = name

    def get(self, key: str | int) -> Module:
        """The submodule at a dotted ``key`` (ints index `from_list` modules)."""
        node: Module = self
        for part in str(key).split("."):
            if part.lstrip("-").isdigit() and int(part) < 0 and node._list_len is not None:
                part = str(node._list_len + int(part))
            if part not in node._submodules and isinstance(node.__dict__.get(part), Tensor):
                return node.__dict__[part]  # from_variable_factories' inputs are tensors
            if part not in node._submodules:
                raise KeyError(
                    f"{type(node).__name__} has no submodule {part!r} "
                    f"(submodules: {list(node._submodules)})."
                )
            node = node._submodules[part]
        return node

    def __getitem__(self, key: str | int) -> Module:
        return self.get(key)

    def __iter__(self) -> Iterator[Module]:
        if self._list_len is None:
            raise TypeError(
                f"{type(self).__name__} is not iterable; only modules made with "
                "Module.from_list are."
            )
        return (self._submodules[str(i)] for i in range(self._list_len))

    def __bool__(self) -> bool:
        # PopXL's Module has no __len__, so every module is truthy (apps test `if self.ln:`);
        # without this, Python's truth test would fall back on __len__ and raise
        return True

    def __len__(self) -> int:
        if self._list_len is None:
            raise TypeError(f"{type(self).__name__} has no len(); only Module.from_list has.")
        return self._list_len

    @classmethod
    def from_list(cls, modules: Iterable[Module]) -> Module:
        """A container module whose submodules are ``"0"``, ``"1"``, ... (iterable, indexable)."""
        container = Module()
        modules = list(modules)
        for i, m in enumerate(modules):
            setattr(container, str(i), m)
        container._list_len = len(modules)
        return container

    @classmethod
    def from_variable_factories(cls, inputs: Iterable[VariableFactory]) -> Module:
        """A module whose named inputs ``"0"``, ``"1"``, ... come from ``inputs`` (``m[i]`` is
        the i-th input tensor); made inside a build and assigned to the building module."""
        container = cls()
        for i, f in enumerate(inputs):
            super(Module, container).__setattr__(
                str(i), container.add_variable_factory(f, name=str(i))
            )
        return container

    # named inputs -------------------------------------------------------------------
    def _check_building(self, what: str) -> None:
        try:
            g = gcg()
        except RuntimeError:
            g = None
        if g is None or g is g.main_graph:
            raise RuntimeError(
                f"{type(self).__name__}.{what} was called outside graph construction. Call it "
                "inside build(), and build the graph with module.create_graph(...) (or call "
                "the module inside another module's build)."
            )

    def _taken(self, name: str | int) -> tuple:
        """What the trees hold at ``name``: (any value?, any non-placeholder value?)."""
        held = [
            tree.get(name)
            for tree in (self._variable_factories, self._named_inputs)
            if name in tree
        ]
        return bool(held), any(not isinstance(v, DotTree) or v.len_flat() for v in held)

    def _check_free(self, name: str | int, overwrite: bool) -> bool:
        """Validate ``name``; True if the insert must overwrite an empty placeholder tree
        (a submodule's slot, or what a previous create_graph left)."""
        check_key(name)
        if overwrite:
            return True
        held, used = self._taken(name)
        if used:
            raise ValueError(
                f"{type(self).__name__} already has a named input {name!r}. "
                "Use another name or overwrite=True."
            )
        return held

    def _record(self, name: str | int, t: Any, f: Any, overwrite: bool) -> None:
        if self._submodules:  # the trees hold the children's sub-trees: copying inserts
            self._variable_factories.insert(name, f, overwrite)
            self._named_inputs.insert(name, t, overwrite)
            return
        # With no submodules no other tree holds these trees' sub-trees, so the inserts may
        # add to them in place: a traced torch module (popxl_fx) records thousands of tensors
        # under a few prefixes, and copying inserts would make its build quadratic.
        self._variable_factories._insert_in_place(name, f, overwrite)
        self._named_inputs._insert_in_place(name, t, overwrite)

    def add_variable_input(
        self,
        name: str,
        data_iter: DataIter,
        dtype: dtype | None = None,
        by_ref: bool = False,
        replica_grouping=None,
        overwrite: bool = False,
    ) -> Tensor:
        """A graph input named ``name`` plus a factory for the variable that feeds it."""
        self._check_building(f"add_variable_input({name!r})")
        overwrite = self._check_free(name, overwrite)
        t, f = add_variable_input(name, data_iter, dtype, by_ref, replica_grouping)
        self._record(name, t, f, overwrite)
        return t

    def add_replica_sharded_variable_input(
        self,
        name: str,
        data_iter: DataIter,
        dtype: dtype | None = None,
        by_ref: bool = False,
        replica_grouping=None,
        shard_over: int | None = None,
    ) -> Tensor:
        """Like `add_variable_input`, for a replica-sharded variable (the input is the shard)."""
        self._check_building(f"add_replica_sharded_variable_input({name!r})")
        overwrite = self._check_free(name, False)
        t, f = add_replica_sharded_variable_input(
            name, data_iter, dtype, by_ref, replica_grouping, shard_over
        )
        self._record(name, t, f, overwrite)
        return t

    def add_variable_factory(
        self, variable_f: VariableFactory, name: str | None = None, overwrite: bool = False
    ) -> Tensor:
        """A graph input for an existing factory, stored under ``name`` (default its name)."""
        name = name if name is not None else variable_f.name
        self._check_building(f"add_variable_factory({name!r})")
        if name is None:  # a nameless factory and no name given
            check_key(name)  # DotTree's TypeError for a key that is not str or int
        assert name is not None
        overwrite = self._check_free(name, overwrite)
        t = variable_f.create_input()
        self._record(name, t, variable_f, overwrite)
        return t

    def add_variable_inputs(
        self, name: str | int, variable_f: NamedVariableFactories, overwrite: bool = False
    ) -> NamedTensors:
        """New graph inputs for every factory of ``variable_f``, stored under ``name.*``.

        Use it to outline: bind one subgraph to several sets of named inputs.
        """
        prefix = str(name)
        self._check_building(f"add_variable_inputs({prefix!r})")
        overwrite = self._check_free(prefix, overwrite)
        inputs = {k: f.input_named(f"{prefix}.{k}") for k, f in variable_f.to_dict().items()}
        named = NamedTensors.from_dict(inputs)
        self._variable_factories.insert(prefix, variable_f.copy(), overwrite)
        self._named_inputs.insert(prefix, named.copy(), overwrite)
        return named

    # graphs -----------------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Inline ``build`` into the current graph."""
        if self.implements_grad_graph and self.grad_inlining_error != "none":
            msg = (
                f"{type(self).__name__}: `build_grad` has been implemented, but calling the "
                "module inline skips the custom gradient. Outline it with "
                "`self.call_module(module)(...)`, or set grad_inlining_error='none'."
            )
            if self.grad_inlining_error == "error":
                raise RuntimeError(msg)
            warnings.warn(msg, stacklevel=2)
        return self.build(*args, **kwargs)

    def create_graph(
        self, *args: Any, **kwargs: Any
    ) -> tuple[NamedVariableFactories, GraphWithNamedArgs]:
        """Trace `build` into a new subgraph ``{ClassName}_subgraph(N)``.

        Tensor/TensorSpec arguments become graph inputs. Returns the factories of the named
        inputs and the graph; the module keeps no state afterwards.
        """
        try:
            ir = gcg().ir
        except RuntimeError:
            raise RuntimeError(
                f"{type(self).__name__}.create_graph needs a graph context: "
                "call it inside `with ir.main_graph:`."
            ) from None
        try:
            if self._graph_cache is None:
                graph = ir.create_graph(self, *args, **kwargs)
                state = self._state()
            else:
                graph = self._graph_cache.create_graph(self, *args, **kwargs)
                state = self._cached_args.get(graph) or self._state()
                self._cached_args[graph] = state
            if self.implements_grad_graph:
                mark_unsafe_to_autodiff(graph)
            facts, named, aux, called = state
            return facts.copy(), GraphWithNamedArgs(
                graph, named.copy(), from_module=self, aux=aux, called_graphs_grad_info=called
            )
        finally:
            self._reset()

    def _state(self) -> tuple:
        return (
            self._variable_factories.copy(),
            self._named_inputs.copy(),
            self.aux.raw(),
            self._all_called_graphs_grad_info(),
        )

    def _reset(self) -> None:
        for tree, attr in (
            (self._variable_factories, "_variable_factories"),
            (self._named_inputs, "_named_inputs"),
        ):
            tree._clear()
            for key in tree.keys():  # only (empty) sub-trees are left
                if key not in self._submodules:
                    tree.pop(key)
            for key, child in self._submodules.items():
                tree._set(key, getattr(child, attr))  # re-link slots an outline replaced
        self.aux = AuxStore()
        self.var_grad = VarGradStore()
        self._called_graphs_grad_info = {}
        for child in self._submodules.values():
            child._reset()
