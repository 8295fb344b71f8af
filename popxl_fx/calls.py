"""How a traced ``forward`` is called and what it returns, as a static program sees it.

A program's inputs are a flat tuple of tensors (one host stream each). `Binding` says how
that tuple reaches ``forward``: the first ones positionally, the rest by keyword
(``model(ids, attention_mask=m, labels=y)``), plus keyword arguments that are not tensors
(``use_cache=False``), which are constants of the program. Every other parameter of
``forward`` (HuggingFace models have dozens, and ``**kwargs``) keeps its default: the trace
calls ``forward`` as Python would, so an unused optional argument or ``**kwargs`` is frozen to
its default at capture (as HuggingFace's own fx tracer did with ``concrete_args``), and a
``forward(*args)`` gets its tensors as separate arguments.

`flat_outputs` flattens what ``forward`` returns (tensors in tuples, lists, dicts,
namedtuples, dataclasses and HuggingFace ``ModelOutput``s) into leaves and a structure to
rebuild it from, so the entry points return the structure ``forward`` returns; a leaf that is
not a tensor (a KV cache object) is named.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.utils._pytree as pytree

__all__ = ["POSITIONAL", "Binding", "bind", "flat_outputs", "loss_position"]

_PLAIN = (bool, int, float, str, type(None))


@dataclass(frozen=True)
class Binding:
    """How a flat tuple of tensors is passed to ``forward``.

    Args:
        keywords: names of the trailing tensors, passed by keyword (the rest are positional).
        constants: keyword arguments that are not tensors, ``(name, value)``: part of the
            program (a change builds another program).
    """

    keywords: tuple[str, ...] = ()
    constants: tuple[tuple[str, Any], ...] = ()

    def split(self, xs: Sequence[Any]) -> tuple[tuple, dict]:
        """The positional arguments and keyword arguments for the flat tuple ``xs``."""
        n = len(xs) - len(self.keywords)
        kwargs = dict(zip(self.keywords, xs[n:]))
        kwargs.update(self.constants)
        return tuple(xs[:n]), kwargs

    def call(self, fn: Callable, *xs: Any) -> Any:
        """``fn`` called with the flat tuple ``xs`` bound this way."""
        args, kwargs = self.split(xs)
        return fn(*args, **kwargs)

    def names(self, fn: Callable, n: int, skip_self: bool = True) -> list[str]:
        """Placeholder names for ``n`` flat inputs: forward's parameter names where a
        positional input fills a named parameter, ``input<i>`` otherwise, keyword names."""
        try:
            params = list(inspect.signature(inspect.unwrap(fn)).parameters.values())
        except (TypeError, ValueError):
            params = []
        params = params[1:] if skip_self and params else params
        named = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        n_pos = n - len(self.keywords)
        positional = [named[i] if i < len(named) else f"input{i}" for i in range(n_pos)]
        return positional + list(self.keywords)

    def key(self) -> tuple:
        """What the program is specialised to (part of the signature)."""
        return self.keywords, tuple((k, repr(v)) for k, v in self.constants)


POSITIONAL = Binding()


def bind(args: Sequence[Any], kwargs: dict[str, Any]) -> tuple[tuple, Binding]:
    """The flat tensor inputs and the `Binding` of a call ``forward(*args, **kwargs)``.

    Positional arguments stay as they are; keyword tensors follow them in the order given;
    keyword arguments that are plain Python values (``None``, bools, numbers, strings and
    tuples of them) are constants. Anything else raises, naming the argument.
    """
    keywords, constants, tensors = [], [], []
    for name, value in kwargs.items():
        if isinstance(value, torch.Tensor):
            keywords.append(name)
            tensors.append(value)
        elif _plain(value):
            constants.append((name, value))
        else:
            raise TypeError(
                f"keyword argument {name}={type(value).__name__} is neither a tensor nor a "
                "plain Python value (None, bool, number, string); a static program takes "
                f"tensors as inputs and plain values as constants: pass {name} as a tensor, "
                "or leave it out to use forward's default."
            )
    return (*args, *tensors), Binding(tuple(keywords), tuple(constants))


def _plain(value: Any) -> bool:
    if isinstance(value, tuple):
        return all(_plain(v) for v in value)
    return isinstance(value, _PLAIN)


# outputs ---------------------------------------------------------------------------------
def _is_leaf_value(x: Any) -> bool:
    return isinstance(x, torch.Tensor) or isinstance(x, torch.fx.Proxy) or isinstance(x, _PLAIN)


def _dataclass_node(cls: type) -> None:
    """A plain dataclass returned by forward becomes a pytree node, as HuggingFace registers
    its ``ModelOutput`` classes (and like those, its fields that are None are no leaves), so
    it is rebuilt on the way out."""
    if cls in pytree.SUPPORTED_NODES:
        return
    names = [f.name for f in dataclasses.fields(cls) if f.init]

    def children(obj: Any) -> tuple[list, list]:
        present = [n for n in names if getattr(obj, n) is not None]
        return [getattr(obj, n) for n in present], present

    def rebuild(values: list, present: list) -> Any:
        return cls(**{**dict.fromkeys(names), **dict(zip(present, values))})

    def with_keys(obj: Any) -> tuple[list, list]:
        values, present = children(obj)
        return [(pytree.GetAttrKey(n), v) for n, v in zip(present, values)], present

    pytree.register_pytree_node(
        cls,
        children,
        rebuild,
        serialized_type_name=f"{cls.__module__}.{cls.__qualname__}",
        flatten_with_keys_fn=with_keys,
    )


def _register_dataclasses(out: Any) -> None:
    if dataclasses.is_dataclass(out) and not isinstance(out, type):
        _dataclass_node(type(out))
    children, _ = pytree.tree_flatten(out, is_leaf=lambda x: x is not out)
    for child in children:
        if child is not out and not _is_leaf_value(child):
            _register_dataclasses(child)


def flat_outputs(out: Any) -> tuple[Any, pytree.TreeSpec, list[tuple[str, str]]]:
    """What ``forward`` returned, with its dataclasses (``ModelOutput``s) turned into dicts
    and namedtuples into tuples (what torch.fx holds in a graph's output as it is; the same
    leaves in the same order), the pytree
    structure of the original to rebuild it from, and the leaves that are not tensors:
    ``(path, type name)`` (they are left out, as ``None``)."""
    _register_dataclasses(out)
    pairs, spec = pytree.tree_flatten_with_path(out)
    bad = [
        (pytree.keystr(path) or "output", type(v).__name__)
        for path, v in pairs
        if not _is_leaf_value(v)
    ]
    if bad:  # dropped: the structure without them is what the program returns
        kept = [v if _is_leaf_value(v) else None for _, v in pairs]
        out = pytree.tree_unflatten(kept, spec)
        _, spec = pytree.tree_flatten(out)
    return _as_fx(out), spec, bad


def _as_fx(out: Any) -> Any:
    """Dataclasses as dicts and namedtuples as tuples, recursively (fx would make a call of
    their class a node); the same leaves in the same order."""
    if dataclasses.is_dataclass(out) and not isinstance(out, type):
        if isinstance(out, dict):  # a ModelOutput: a dict of its fields that are set
            return {k: _as_fx(v) for k, v in out.items()}
        fields = [f.name for f in dataclasses.fields(out) if f.init]
        return {n: _as_fx(getattr(out, n)) for n in fields if getattr(out, n) is not None}
    if isinstance(out, tuple):  # a namedtuple too: fx would make its construction a node
        return tuple(_as_fx(v) for v in out)
    if isinstance(out, list):
        return [_as_fx(v) for v in out]
    if isinstance(out, dict):
        return {k: _as_fx(v) for k, v in out.items()}
    return out


def loss_position(spec: pytree.TreeSpec, n_outputs: int) -> int | None:
    """Which flattened output is the loss: the only one, ``out["loss"]`` / ``out.loss``, or
    ``out[0]`` of a tuple or list; None when there is none of these."""
    where: Any = pytree.tree_unflatten(list(range(n_outputs)), spec)
    if isinstance(where, dict) and "loss" in where:
        where = where["loss"]
    elif dataclasses.is_dataclass(where) and isinstance(getattr(where, "loss", None), int):
        where = cast(Any, where).loss  # (the checker's narrowed dataclass type has no field)
    elif isinstance(where, tuple) and hasattr(where, "_fields") and "loss" in where._fields:
        where = cast(Any, where).loss  # a namedtuple's field
    elif isinstance(where, (tuple, list)) and where:
        where = where[0]
    return where if isinstance(where, int) else None
