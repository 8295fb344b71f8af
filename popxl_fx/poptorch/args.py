"""Custom argument types: ``poptorch.ICustomArgParser`` and ``registerCustomArgParser``.

A parser says which tensors an object of its type holds (``yieldTensors``) and how to build
the object again around other tensors (``reconstruct``); the executor passes those tensors to
the program and rebuilds the object inside the traced forward.
"""

from __future__ import annotations

import abc
import copy
from collections import OrderedDict, defaultdict
from typing import Any

import torch
import torch.utils._pytree as pytree

from .errors import Error

__all__ = ["DICT_SUBCLASS_PARSER", "ICustomArgParser", "parser_for", "registerCustomArgParser"]

_PARSERS: dict[type, ICustomArgParser] = {}


class ICustomArgParser(abc.ABC):
    """The tensors of a custom argument type, and how to rebuild it."""

    @abc.abstractmethod
    def yieldTensors(self, struct) -> Any:
        """Yield every tensor of ``struct``, in a fixed order."""

    @abc.abstractmethod
    def reconstruct(self, original_structure, tensor_iterator) -> Any:
        """``original_structure`` rebuilt with tensors taken from ``tensor_iterator``."""


def registerCustomArgParser(arg_data_type: type, arg_parser: ICustomArgParser | None) -> None:
    """Use ``arg_parser`` for arguments of ``arg_data_type`` (None removes it)."""
    if arg_parser is None:
        _PARSERS.pop(arg_data_type, None)
        return
    if not isinstance(arg_parser, ICustomArgParser):
        raise Error("arg_parser must inherit from ICustomArgParser")
    _PARSERS[arg_data_type] = arg_parser


class _MappingParser(ICustomArgParser):
    """A dict subclass (``class MyArg(OrderedDict)``): its values' tensors, in key order;
    rebuilt as a copy of the same type (PopTorch takes them without a parser too)."""

    def yieldTensors(self, struct) -> Any:
        leaves = pytree.tree_leaves(list(struct.values()))
        yield from (x for x in leaves if isinstance(x, torch.Tensor))

    def reconstruct(self, original_structure, tensor_iterator) -> Any:
        rebuilt = copy.copy(original_structure)
        for key, value in original_structure.items():
            rebuilt[key] = pytree.tree_map_only(
                torch.Tensor, lambda _: next(tensor_iterator), value
            )
        return rebuilt


DICT_SUBCLASS_PARSER = _MappingParser()
_PYTREE_DICTS = (dict, OrderedDict, defaultdict)  # flattened by torch's pytree itself


def parser_for(value: object) -> ICustomArgParser | None:
    """The registered parser of ``value``'s type (else of a registered base class, as
    PopTorch looks them up), or the built-in one of a dict subclass."""
    parser = _PARSERS.get(type(value))
    if parser is None and _PARSERS:
        parser = next((p for t, p in _PARSERS.items() if isinstance(value, t)), None)
    if parser is None and isinstance(value, dict) and type(value) not in _PYTREE_DICTS:
        return DICT_SUBCLASS_PARSER
    return parser
