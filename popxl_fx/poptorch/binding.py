"""PopTorch's binding of a call to ``forward``'s signature, and its check of a later call
against the compiled one.

PopTorch names every input by forward's parameters: defaults fill the ones left out, the
variadic positionals are ``*name[i]`` and everything after them (and ``**kwargs``) is a
named argument. A later call is bound the same way and compared with the compiled call
input by input, so leaving out an optional tensor that was given at compile time is a type
mismatch (its default, None, against a tensor), and leaving out a ``**kwargs`` entry is a
missing argument.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch
import torch.utils._pytree as pytree

from .errors import Error

__all__ = ["Bound", "bind", "validate"]

_EMPTY = inspect.Parameter.empty
_VAR_POS = inspect.Parameter.VAR_POSITIONAL
_VAR_KW = inspect.Parameter.VAR_KEYWORD


class Bound:
    """A call bound to forward's parameters: ``args`` (name, value) in order, ``named``."""

    def __init__(self) -> None:
        self.args: list[tuple[str, Any]] = []
        self.named: dict[str, Any] = {}


def _parameters(fn) -> tuple[inspect.Parameter, ...]:
    """``fn``'s parameters (a bound method's without ``self``); read once per function, as
    every call of the executor binds its arguments."""
    function = getattr(fn, "__func__", None)
    if function is None:
        return _signature_of(fn, False)
    return _signature_of(function, True)


@functools.lru_cache(maxsize=256)
def _signature_of(fn, drop_self: bool) -> tuple[inspect.Parameter, ...]:
    try:
        parameters = tuple(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # no signature: PopTorch takes (*args, **kwargs)
        return (inspect.Parameter("args", _VAR_POS), inspect.Parameter("kwargs", _VAR_KW))
    return parameters[1:] if drop_self else parameters


def bind(fn, args: tuple, kwargs: dict) -> Bound:
    """``args`` / ``kwargs`` bound to ``fn``'s parameters as PopTorch binds them."""
    bound, rest, after_var = Bound(), list(args), False
    for p in _parameters(fn):
        if p.kind == _VAR_KW:
            bound.named.update((k, v) for k, v in kwargs.items() if k not in bound.named)
        elif p.kind == _VAR_POS:
            bound.args += [(f"*{p.name}[{i}]", v) for i, v in enumerate(rest)]
            rest, after_var = [], True
        elif rest:
            bound.args.append((p.name, rest.pop(0)))
        else:
            _bind_named(bound, p, kwargs, after_var)
    return bound


def _bind_named(bound: Bound, p: inspect.Parameter, kwargs: dict, after_var: bool) -> None:
    if p.name in kwargs:
        value = kwargs[p.name]
    elif p.default is not _EMPTY:
        value = p.default
    else:
        raise Error(f"Mandatory parameter {p.name} missing")
    if after_var:  # everything after the variadic positionals is named
        bound.named[p.name] = value
    else:
        bound.args.append((p.name, value))


def validate(compiled: Bound, given: Bound, end: str) -> None:
    """PopTorch's error for the first input of ``given`` unlike ``compiled``'s."""
    if len(given.args) != len(compiled.args):
        raise Error(
            "Number of positional arguments mismatch: expected "
            f"{len(compiled.args)} arguments but got {len(given.args)}.{end}"
        )
    for (name, c), (_, g) in zip(compiled.args, given.args):
        _validate(name, c, g, end)
    _validate_dict("named arguments", compiled.named, given.named, end, named=True)


def _kind(value) -> type:
    return tuple if isinstance(value, list) else type(value)


def _validate(name: str, c, g, end: str) -> None:
    if _kind(c) is not _kind(g):
        raise Error(f"Type mismatch for {name}: expected {type(c)} but got {type(g)}.{end}")
    if isinstance(c, (tuple, list)):
        if len(c) != len(g):
            raise Error(
                f"Length mismatch for {name}: expected {len(c)} elements but got {len(g)}.{end}"
            )
        for i, (ci, gi) in enumerate(zip(c, g)):
            _validate(f"{name}[{i}]", ci, gi, end)
    elif isinstance(c, dict):
        _validate_dict(name, c, g, end)
    elif isinstance(c, torch.Tensor):
        _validate_tensor(name, c, g, end)
    elif not _holds_tensors(c) and not _equal(c, g):
        # other values are compiled into the program: a new one cannot reuse it
        raise Error(f"Value mismatch for {name}: expected {c} but got {g}.{end}")


def _holds_tensors(value) -> bool:
    return any(isinstance(x, torch.Tensor) for x in pytree.tree_leaves(value))


def _equal(a, b) -> bool:
    try:
        return bool(a == b)
    except (RuntimeError, TypeError, ValueError):  # not comparable: a custom argument type
        return True


def _validate_dict(name: str, c: dict, g: dict, end: str, named: bool = False) -> None:
    if set(c) != set(g):
        extra, missing = sorted(set(g) - set(c)), sorted(set(c) - set(g))
        details = [f"Unexpected arguments: {', '.join(map(str, extra))}"] if extra else []
        details += [f"Missing arguments: {', '.join(map(str, missing))}"] if missing else []
        raise Error(f"Keys mismatch for {name}: {'. '.join(details)}.{end}")
    for k, v in c.items():
        _validate(k if named else f"{name}[{k}]", v, g[k], end)


def _validate_tensor(name: str, c: torch.Tensor, g: torch.Tensor, end: str) -> None:
    if c.dtype != g.dtype:
        raise Error(f"Data type mismatch for {name}: expected {c.dtype} but got {g.dtype}.{end}")
    if c.shape != g.shape:
        raise Error(f"Shape mismatch for {name}: expected {c.shape} but got {g.shape}.{end}")
